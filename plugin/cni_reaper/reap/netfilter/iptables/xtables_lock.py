"""The xtables lock: `flock` on /run/xtables.lock, as iptables-legacy and go-iptables (`--wait`) take it
around every table replace. python-iptables takes none, so we take it around each of its commits."""

from __future__ import annotations

import os
from contextlib import contextmanager

from cni_reaper.locking import flock_within
from cni_reaper.reap.netfilter.interface import BackendError, LockHeld

LOCK_PATH = os.environ.get("XTABLES_LOCKFILE", "/run/xtables.lock")


@contextmanager
def xtables_lock(timeout: float = 3.0):
    try:
        fd = os.open(LOCK_PATH, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise BackendError(f"cannot open {LOCK_PATH}: {exc.strerror}") from None
    try:
        if not flock_within(fd, timeout):
            raise LockHeld(f"the xtables lock {LOCK_PATH} is held by another process for more than {timeout:g}s")
        yield
    finally:
        os.close(fd)
