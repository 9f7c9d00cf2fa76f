"""The xtables lock: `flock` on /run/xtables.lock, as iptables-legacy and go-iptables (`--wait`) take it
around every table replace. python-iptables takes none, so we take it around each of its commits."""

from __future__ import annotations

import os
import time

from cni_reaper.files import flock_within, hold_deadline
from cni_reaper.reap.netfilter.interface import BackendError, LockHeld

LOCK_PATH = os.environ.get("XTABLES_LOCKFILE", "/run/xtables.lock")


class xtables_lock:  # lower case: used as a function, `with xtables_lock():` (contextlib costs milliseconds)
    def __init__(self, timeout: float = 3.0) -> None:
        self.timeout = timeout
        self.fd = -1

    def __enter__(self) -> None:
        try:  # never blocking: a FIFO at the path would hold the open itself
            fd = os.open(LOCK_PATH, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise BackendError(f"cannot open {LOCK_PATH}: {exc.strerror}") from None
        wait, held = self.timeout, hold_deadline()  # no longer than a lock others wait for may still be held
        if held is not None:
            wait = max(0.0, min(wait, held[0] - time.monotonic()))
        if not flock_within(fd, wait):
            os.close(fd)
            raise LockHeld(f"the xtables lock {LOCK_PATH} is held by another process for more than {wait:g}s")
        self.fd = fd

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
