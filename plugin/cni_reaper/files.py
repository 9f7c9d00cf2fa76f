"""How cni-reaper opens a file it writes and how it waits for a lock.

`open_regular`: the one way to open a file cni-reaper writes (the log, a record, the journal, the lock, the
metrics textfile, a put-back reservation): never blocking, never through a symlink, and only a regular file.
A FIFO nobody reads, a device, a socket or a directory at the path is refused at once (OSError), so that no
verb ever waits on a file (docs/how-it-works.md, "Never block an allocation").

`flock_within`: one bounded wait for an exclusive flock, shared by the state lock, host-local's lock and the
xtables lock.

`holding`: how long cni-reaper may keep a lock other allocations wait for (its state lock, host-local's lock of
a network) with work that may hang in it: every netfilter tool run meanwhile ends within half the lock's
timeout of the lock being taken, all told (reap/netfilter/processes.py asks `hold_deadline`)."""

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


def untrusted(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory cni-reaper is steered by or writes to must not be used (None: it may), as sudo
    and systemd judge theirs: owned by another user than this process's (root's), or writable by its group or
    by others (a directory with the sticky bit that root owns, /tmp's kind, is not taken for writable by
    others: they cannot replace what is in it)."""
    if st.st_uid not in (0, os.geteuid()):
        return f"{what} is owned by uid {st.st_uid}"
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0
    if st.st_mode & 0o022 and not sticky:
        whom = 'its group' if st.st_mode & 0o020 else 'others'
        return f"{what} is writable by {whom} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


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


def holders_stopped(path: str) -> bool:
    """Whether a flock on `path` is held and every process holding it is stopped (SIGSTOP, a shell's Ctrl-Z, a
    debugger): it lets go of nothing until someone resumes it, so waiting for it buys nothing. False when it
    cannot be told (/proc/locks unreadable, the file gone, a holder in another PID namespace)."""
    try:
        st = os.stat(path)
        with open("/proc/locks", "rb") as f:
            table = f.read().decode("ascii", "replace")
    except OSError:
        return False
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = [int(f[4]) for f in (line.split() for line in table.splitlines())
            if len(f) > 5 and f[1] == "FLOCK" and f[5] == wanted and f[4].isdigit()]
    return bool(pids) and all(_stopped(pid) for pid in pids)


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 1:].split()
    return bool(fields) and fields[0] in (b"T", b"t")


# how long the tools may run, all told, while cni-reaper holds a lock other allocations wait for, as a share of
# that lock's timeout (lockTimeout, 10 s by default: 5 s): the state lock (every allocation's cni-reaper waits
# lockTimeout for it, then answers CNI error 11) and host-local's lock of a network (another allocation's
# host-local waits for it, with no timeout of its own). A tool that hangs there is stopped by then, and a later
# call retries. The netfilter part of a sweep of 1,000 dead attachments takes about 1 s here
# (docs/performance.md); a tool's own timeout is 30 s.
HOLD_SHARE = 0.5
_HELD: list[tuple[float, str]] = []  # (end, what is held) of each lock held now


class holding:  # lower case: used as a function, `with holding(lock_timeout, what):`
    """A lock others wait for, and cni-reaper within `lock_timeout`, is held (`what`): work that may hang ends
    within HOLD_SHARE of `lock_timeout` from now."""

    def __init__(self, lock_timeout: float, what: str) -> None:
        self.seconds = lock_timeout * HOLD_SHARE
        self.what = f"within the {self.seconds:g} s cni-reaper may hold {what}"
        self.entry: tuple[float, str] | None = None

    def __enter__(self) -> None:
        self.entry = (time.monotonic() + self.seconds, self.what)
        _HELD.append(self.entry)

    def __exit__(self, *exc: object) -> None:
        if self.entry is not None:  # its own (locks need not be let go in the order they were taken)
            _HELD.remove(self.entry)
            self.entry = None


def hold_deadline() -> tuple[float, str] | None:
    """(end, what) of the first hold to end among the locks held now (None: none held)."""
    return min(_HELD) if _HELD else None
