"""The xtables lock: `flock` on /run/xtables.lock, as iptables-legacy and go-iptables (`--wait`) take it
around every table replace. python-iptables takes none, so we take it around each of its commits."""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager

from .backend import BackendError

LOCK_PATH = os.environ.get("XTABLES_LOCKFILE", "/run/xtables.lock")


@contextmanager
def xtables_lock(timeout: float = 5.0):
    try:
        fd = os.open(LOCK_PATH, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise BackendError(f"cannot open {LOCK_PATH}: {exc.strerror}") from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise BackendError(f"the xtables lock {LOCK_PATH} is held by another process") from None
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)
