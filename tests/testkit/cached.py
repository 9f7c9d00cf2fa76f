"""What the tests make once and keep in the test cache (root file systems, unpacked packages)."""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path


def made_once(out: Path, lock: str, make: Callable[[Path], None]) -> Path:
    """`out`, made by `make(tmp)` the first time (into a temporary folder beside it, renamed whole when done),
    under a lock file `lock` in the cache so that parallel tests make it once."""
    if (out / ".complete").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if (out / ".complete").exists():
            return out
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        make(tmp)
        (tmp / ".complete").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out
