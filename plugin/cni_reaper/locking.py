"""One bounded wait for an exclusive flock, shared by the state lock, host-local's lock and the xtables lock."""

from __future__ import annotations

import fcntl
import time


def flock_within(fd: int, timeout: float) -> bool:
    """Take an exclusive flock on fd, waiting at most `timeout` seconds. False when it stayed held."""
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
