"""Running the real plugin as the runtime would have: the same argv tail, environment and stdin; its stderr is
this process's (passed through as it is written), its stdout is captured to be returned unchanged. Without
`subprocess` (its imports cost milliseconds on every call): fork and execve, stdin from a memfd (no pipe
can fill up against a plugin that writes before it has read), stdout through a pipe, and as `subprocess`
does, the signals Python ignores (SIGPIPE, SIGXFSZ) back to their defaults in the child and an exec that
fails told to the parent through a close-on-exec pipe. While the plugin runs, the parent may do work of its
own that touches nothing the plugin sees (`meanwhile`: the wrapper imports what its own part will need)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

import _signal as signal  # the C module: `signal` imports enum, milliseconds on every call
import os


class ExecFailed(Exception):
    """The real plugin could not be executed (errno in args[0])."""


def run(exe: str, argv: list[str], env: dict[str, str], stdin: bytes,
        meanwhile: Callable[[], None] | None = None) -> tuple[int, bytes]:
    """(exit status, stdout) of `exe`: its exit status, or minus the signal that killed it (as Go's
    ExitCode and Python's returncode say). ExecFailed when it could not be run at all. `meanwhile` is
    called once the plugin is started, before its output is read (its stdout waits in the pipe); whatever
    it raises is dropped."""
    ignored = signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN  # a runtime may pass that on across exec
    if ignored:  # the kernel would reap the plugin itself: its exit status could not be read
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    fd = os.memfd_create("cni-stdin", os.MFD_CLOEXEC)
    try:
        os.write(fd, stdin)
        os.lseek(fd, 0, os.SEEK_SET)
        r, w = os.pipe()
        er, ew = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            _child(exe, argv, env, (fd, w, ew), ignored)
        os.close(w)
        os.close(ew)
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:  # noqa: BLE001 - the plugin's answer is read and returned whatever happens here
                pass
        chunks = []
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(r)
        failed = os.read(er, 32)
        os.close(er)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    if failed:
        raise ExecFailed(int(failed))
    return os.waitstatus_to_exitcode(status), b"".join(chunks)


def _child(exe: str, argv: list[str], env: dict[str, str], fds: tuple[int, int, int], sigchld_ignored: bool) -> None:
    """The forked child: nothing of Python's may run here but the exec (stdin, stdout, and the pipe that tells
    the parent why an exec failed)."""
    stdin, stdout, failed = fds
    try:
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        if sigchld_ignored:  # the plugin inherits what it would have inherited from the runtime
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        os.execve(exe, argv, env)
    except OSError as exc:
        os.write(failed, str(exc.errno).encode())
    finally:
        os._exit(127)
