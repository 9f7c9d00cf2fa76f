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

from cni_reaper.files import hold_deadline

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
    _reap_own_children()
    env = dict(os.environ, LC_ALL="C")
    deadline, within = time.monotonic() + timeout, f"within {timeout:g} s"
    held = hold_deadline()  # a lock others wait for is held: its hold ends first
    if held is not None and held[0] < deadline:
        deadline, within = held
        if deadline <= time.monotonic():
            raise TimeoutError(f"not started: no time was left {within}")
    started: list[tuple[int, int, int]] = []  # pid, stdout, stderr
    try:
        for argv, stdin in zip(argvs, stdins or [None] * len(argvs)):
            _start(argv, None if stdin is None else stdin.encode("utf-8", "surrogateescape"), env, started)
        texts = _drain([fd for _, out, err in started for fd in (out, err)], deadline, within)
        results = []
        for k, (pid, out, err) in enumerate(started):
            _close(out, err)
            status = _wait(pid, deadline, within)
            results.append(Finished(os.waitstatus_to_exitcode(status), texts[2 * k], texts[2 * k + 1]))
        started = []
        return results
    finally:  # something failed or timed out: nothing is left running or open
        for pid, out, err in started:
            try:
                os.kill(pid, _signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            _close(out, err)


def _reap_own_children() -> None:
    """SIGCHLD back to its default when this process was started with it ignored (a runtime may pass that on
    across exec): with it ignored the kernel reaps the tools itself and no exit status can be read."""
    if _signal.getsignal(_signal.SIGCHLD) == _signal.SIG_IGN:
        try:
            _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        except ValueError:  # not the main thread: nothing to do about it here (waitpid then says ECHILD)
            pass


def _wait(pid: int, deadline: float, within: str) -> int:
    """The tool's exit status, once it has closed its output: at once as a rule; a tool that lives on after
    it (it closed its pipes and went on) is waited for until the deadline (TimeoutError: the caller kills)."""
    pause = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no exit {within}")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _start(argv: list[str], stdin: bytes | None, env: dict[str, str], started: list[tuple[int, int, int]]) -> None:
    """Start a tool; (pid, stdout, stderr) appended to `started` (what the caller kills and closes if it must).
    Whatever cannot be made (a full descriptor table) leaves nothing open."""
    opened: list[int] = []
    try:
        if stdin is None:
            fd_in = _high(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC), opened)
        else:
            fd_in = _high(os.memfd_create("cni-reaper-stdin", os.MFD_CLOEXEC), opened)
            view = memoryview(stdin)
            while view:
                view = view[os.write(fd_in, view):]
            os.lseek(fd_in, 0, os.SEEK_SET)
        r_out, w_out = _pipe(opened)
        r_err, w_err = _pipe(opened)
        actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, fd_in, 0), (os.POSIX_SPAWN_DUP2, w_out, 1),
                                          (os.POSIX_SPAWN_DUP2, w_err, 2)]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable()]  # as subprocess's close_fds
        pid = os.posix_spawn(argv[0], argv, env, setsigdef=_DEFAULT_SIGNALS, file_actions=actions)
        started.append((pid, r_out, r_err))
        opened = [fd_in, w_out, w_err]
    finally:
        _close(*opened)


def _pipe(opened: list[int]) -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC)
    opened += [r, w]
    return _high(r, opened), _high(w, opened)


def _inheritable() -> list[int]:
    """This process's descriptors above the standard three that a tool would inherit (not close-on-exec)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                out.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out


def _high(fd: int, opened: list[int]) -> int:
    """`fd`, or a close-on-exec copy of it above the standard three (a process started without them gets
    them as its first new files: dup2 onto itself would not clear close-on-exec); kept in `opened`."""
    if fd > 2:
        if fd not in opened:
            opened.append(fd)
        return fd
    if fd not in opened:
        opened.append(fd)
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    opened.remove(fd)
    os.close(fd)
    opened.append(high)
    return high


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _drain(fds: list[int], deadline: float, within: str) -> list[str]:
    """Everything each pipe gives until its end, all read side by side (TimeoutError at the deadline)."""
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    poller: Any = select.poll()
    for fd in fds:
        poller.register(fd, _IN)
    left_open = len(fds)
    while left_open:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer {within}")
        for fd, _ in poller.poll(left * 1000):
            data = os.read(fd, 1 << 16)
            if data:
                chunks[fd].append(data)
            else:
                poller.unregister(fd)
                left_open -= 1
    return [b"".join(chunks[fd]).decode("utf-8", "surrogateescape") for fd in fds]
