"""Running the host's netfilter tools (iptables-*-save and -restore, nft) for the backends, without
`subprocess`: its imports (signal, enum, threading, selectors, contextlib) cost every clean-up milliseconds.

Each tool is started with posix_spawn: stdin from a memfd (a large restore script never blocks against a
tool that has not read it yet) or /dev/null, stdout and stderr through pipes read side by side with one
poll (a tool writing more than a pipe holds never waits on us), the signals Python ignores (SIGPIPE,
SIGXFSZ) back to their defaults in the tool as `subprocess` does, LC_ALL=C. Several tools can run at once
(`run_all`). Output is read as UTF-8, any other byte kept as a surrogate (`surrogateescape`), so that a
rule's text given back to the tool is the very bytes it printed.
"""

from __future__ import annotations

import _signal
import fcntl
import os
import select
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_DEFAULT_SIGNALS = (_signal.SIGPIPE, _signal.SIGXFSZ)
_IN = select.POLLIN | select.POLLHUP | select.POLLERR


class Finished:
    """A tool that ran: its exit status (minus the signal that killed it) and what it wrote."""

    __slots__ = ("code", "err", "out")

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


def run(argv: list[str], stdin: str | None = None, timeout: float = 30.0) -> Finished:
    """Run one tool (argv[0] a path). OSError when it cannot be started; TimeoutError (an OSError) when it has
    not finished within `timeout` seconds (it is killed)."""
    return run_all([argv], [stdin], timeout)[0]


def run_all(argvs: list[list[str]], stdins: list[str | None] | None = None, timeout: float = 30.0) -> list[Finished]:
    """Run the tools at the same time; their results in order (the errors as run's)."""
    env = dict(os.environ, LC_ALL="C")
    started: list[tuple[int, int, int]] = []  # pid, stdout, stderr
    try:
        for argv, stdin in zip(argvs, stdins or [None] * len(argvs)):
            started.append(_start(argv, None if stdin is None else stdin.encode("utf-8", "surrogateescape"), env))
        texts = _drain([fd for _, out, err in started for fd in (out, err)], timeout)
    except BaseException:  # nothing is left running or open
        for pid, out, err in started:
            try:
                os.kill(pid, _signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            _close(out, err)
        raise
    results = []
    for k, (pid, out, err) in enumerate(started):
        _close(out, err)
        _, status = os.waitpid(pid, 0)
        results.append(Finished(os.waitstatus_to_exitcode(status), texts[2 * k], texts[2 * k + 1]))
    return results


def _start(argv: list[str], stdin: bytes | None, env: dict[str, str]) -> tuple[int, int, int]:
    if stdin is None:
        fd_in = _high(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    else:
        fd_in = _high(os.memfd_create("cni-reaper-stdin", os.MFD_CLOEXEC))
        view = memoryview(stdin)
        while view:
            view = view[os.write(fd_in, view):]
        os.lseek(fd_in, 0, os.SEEK_SET)
    r_out, w_out = os.pipe2(os.O_CLOEXEC)
    r_err, w_err = os.pipe2(os.O_CLOEXEC)
    w_out, w_err = _high(w_out), _high(w_err)
    try:
        pid = os.posix_spawn(argv[0], argv, env, setsigdef=_DEFAULT_SIGNALS, file_actions=[
            (os.POSIX_SPAWN_DUP2, fd_in, 0), (os.POSIX_SPAWN_DUP2, w_out, 1), (os.POSIX_SPAWN_DUP2, w_err, 2)])
    except BaseException:
        _close(r_out, r_err)
        raise
    finally:
        _close(fd_in, w_out, w_err)
    return pid, r_out, r_err


def _high(fd: int) -> int:
    """`fd`, or a close-on-exec copy of it above the standard three (a process started without them gets
    them as its first new files: dup2 onto itself would not clear close-on-exec)."""
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _drain(fds: list[int], timeout: float) -> list[str]:
    """Everything each pipe gives until its end, all read side by side (TimeoutError after `timeout`)."""
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    poller: Any = select.poll()
    for fd in fds:
        poller.register(fd, _IN)
    left_open = len(fds)
    deadline = time.monotonic() + timeout
    while left_open:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {timeout:g} s")
        for fd, _ in poller.poll(left * 1000):
            data = os.read(fd, 1 << 16)
            if data:
                chunks[fd].append(data)
            else:
                poller.unregister(fd)
                left_open -= 1
    return [b"".join(chunks[fd]).decode("utf-8", "surrogateescape") for fd in fds]
