"""Running the real plugin as the runtime would have: the same argv tail, environment and stdin; its stderr is
this process's (passed through as it is written), its stdout is captured to be returned unchanged. Without
`subprocess` (its imports cost milliseconds on every call): fork and execve, stdin from a memfd (no pipe
can fill up against a plugin that writes before it has read), stdout through a pipe."""

from __future__ import annotations

import os


def run(exe: str, argv: list[str], env: dict[str, str], stdin: bytes) -> tuple[int, bytes]:
    """(exit status, stdout) of `exe`; a plugin killed by a signal gives 128 + the signal, as a shell says."""
    fd = os.memfd_create("cni-stdin", os.MFD_CLOEXEC)
    try:
        os.write(fd, stdin)
        os.lseek(fd, 0, os.SEEK_SET)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: nothing of Python's may run here but the exec
            try:
                os.dup2(fd, 0)
                os.dup2(w, 1)
                os.execve(exe, argv, env)
            finally:
                os._exit(127)
        os.close(w)
        chunks = []
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    code = os.waitstatus_to_exitcode(status)
    return (128 - code if code < 0 else code), b"".join(chunks)
