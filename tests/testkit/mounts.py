"""A small file system of a test's own: a tmpfs of a given size mounted on a directory under the test's tmp dir
(for a state directory that fills up), unmounted again however the test ends. Nothing of the machine's is
mounted over."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_fs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "none", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(fs: Path, name: str = "filler") -> None:
    """Write into `fs` until it is full (ENOSPC): what is left is the slack of its files' last pages."""
    for suffix, chunk in (("", b"\0" * 4096), ("-small", b"\0")):  # pages, then the last partial page's worth
        with open(fs / (name + suffix), "wb", buffering=0) as f:
            try:
                while f.write(chunk):
                    pass
            except OSError:
                pass
