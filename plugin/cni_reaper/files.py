"""How cni-reaper opens a file it writes and how it waits for a lock.

`open_regular`: the one way to open a file cni-reaper writes (the log, a record, the journal, the lock, the
metrics textfile, a put-back reservation): never blocking, never through a symlink, and only a regular file.
A FIFO nobody reads, a device, a socket or a directory at the path is refused at once (OSError), so that no
verb ever waits on a file (docs/how-it-works.md, "Never block an allocation").

`flock_within`: one bounded wait for an exclusive flock, shared by the state lock, host-local's lock and the
xtables lock."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time


def open_regular(path: str, flags: int, mode: int = 0o600, dir_fd: int | None = None) -> int:
    """os.open(path, flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC), refused unless it is a regular file
    (a FIFO without a reader fails at the open itself, ENXIO; anything else that is no regular file after
    it, EINVAL). The caller closes the descriptor."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
