"""Work a CNI call does after its answer. The runtime waits for a plugin's exit and for the end of its stdout;
work that nothing in the answer depends on (an ADD's look at who else maps its host ports) need not make it
wait. `later(work, lock_dir)` keeps the work; when the call ends (main.py `_exit`), `detach` writes nothing
more, points stdin, stdout and stderr at /dev/null (the runtime reads the end of the answer at once), forks,
and the child does the work in a session of its own while the call exits.

While such work runs, its child holds a shared flock of `lock_dir`/AFTERWARDS_LOCK, taken before the call
exits: whoever must know the work is done (the tests, after an ADD) takes that lock exclusively.

Outside a CNI call's own process (the operator's commands, a test calling a verb in process) `later` does
the work at once: only the entry point of a CNI call enables detaching."""

from __future__ import annotations

import os

import cni_reaper

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

AFTERWARDS_LOCK = ".afterwards.lock"

_pending: list[Callable[[], None]] = []
_lock_dirs: list[str] = []


def enable() -> None:
    """This process is one CNI call that ends with main.py's `_exit`: later work may go to a child."""
    cni_reaper.one_call = True


def later(work: Callable[[], None], lock_dir: str) -> None:
    """Do `work` after this call's answer (at once when detaching is not enabled). `work` must not raise:
    nobody is left to hear it."""
    if not cni_reaper.one_call:
        work()
        return
    _pending.append(work)
    _lock_dirs.append(lock_dir)


def detach() -> None:
    """End the call's output and leave its pending work to a child (nothing pending: nothing happens). Called
    once its answer is written and flushed; the caller then exits."""
    if not _pending:
        return
    held = [fd for fd in (_held(d) for d in dict.fromkeys(_lock_dirs)) if fd is not None]
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    try:
        pid = os.fork()
    except OSError:
        return  # no child: the work is not done; a later call's sweep meets what it would have found
    if pid:
        for fd in held:  # the child's copies keep the locks
            os.close(fd)
        return
    os.setsid()
    for work in _pending:
        try:
            work()
        except BaseException:  # noqa: BLE001 - nobody is left to hear it; each work logs its own failures
            pass
    os._exit(0)


def _held(lock_dir: str) -> int | None:
    """A shared flock of the directory's AFTERWARDS_LOCK, or None when it cannot be had within 50 ms (the work
    still runs: only a waiter would miss it; a waiter holds the lock for an instant)."""
    import fcntl
    import time

    try:
        fd = os.open(os.path.join(lock_dir, AFTERWARDS_LOCK),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    for _ in range(50):
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            time.sleep(0.001)
        except OSError:
            break
    os.close(fd)
    return None
