"""The xtables lock: `flock` on /run/xtables.lock, as iptables-legacy and go-iptables (`--wait`) take it
around every table replace. python-iptables takes none, so we take it around each of its commits."""

from __future__ import annotations

import os

from cni_reaper.files import flock_within
from cni_reaper.reap.netfilter.interface import BackendError, LockHeld

LOCK_PATH = os.environ.get("XTABLES_LOCKFILE", "/run/xtables.lock")


class xtables_lock:  # lower case: used as a function, `with xtables_lock():` (contextlib costs milliseconds)
    def __init__(self, timeout: float = 3.0) -> None:
        self.timeout = timeout
        self.fd = -1

    def __enter__(self) -> None:
        try:
            fd = os.open(LOCK_PATH, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise BackendError(f"cannot open {LOCK_PATH}: {exc.strerror}") from None
        if not flock_within(fd, self.timeout):
            os.close(fd)
            raise LockHeld(f"the xtables lock {LOCK_PATH} is held by another process for more than {self.timeout:g}s")
        self.fd = fd

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
