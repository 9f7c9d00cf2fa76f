"""Diagnostics: one JSON object per line, to stderr (libcni hands it to the runtime's log) and to a log file.

In CNI mode stdout belongs to the protocol. The file (config `logFile`, default /var/log/cni-reaper.log,
"" to disable) is size-bounded: past MAX_BYTES it is renamed to `<file>.1` and a new one is started.
A failure to log never fails a verb.
"""

from __future__ import annotations

import os
import sys
import time

from cni_reaper import jsonio

MAX_BYTES = 10 << 20

_context: dict[str, str] = {}
_settings: dict[str, Any] = {"file": "", "stderr": True, "never_stderr": False}
_LEVELS = {"debug": 0, "info": 1, "warning": 2, "error": 3}
TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any


def begin(log_file: str | None = None, stderr: bool = True, **context: str) -> None:
    """Start one invocation's log: where lines go, and the fields every line of it carries (verb, network,
    container ID). Nothing of an earlier invocation in the same process carries over."""
    _settings.update(file=log_file or "", stderr=stderr and not _settings["never_stderr"])
    _context.clear()
    _context.update({k: v for k, v in context.items() if v})


def never_to_stderr() -> None:
    """From now on in this process, lines go to the log file only (a wrapper's stderr is the real plugin's)."""
    _settings.update(never_stderr=True, stderr=False)


def field(name: str) -> str:
    """A field of the current invocation's context ("" when unset): the verb, for instance."""
    return _context.get(name, "")


def _to_file(path: str, line: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    except OSError:
        return
    try:
        if os.fstat(fd).st_size > MAX_BYTES:
            try:
                os.rename(path, path + ".1")
            except OSError:
                pass
            os.close(fd)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        os.write(fd, line.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def event(level: str, msg: str, **fields: object) -> None:
    try:
        entry: dict[str, object] = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "level": level,
                                    "msg": msg}
        entry.update(_context)
        entry.update(fields)
        line = jsonio.dumps(entry, default=str) + "\n"
        if _settings["file"]:
            _to_file(_settings["file"], line)
        if _settings["stderr"] and _LEVELS.get(level, 1) >= _LEVELS["info"]:
            sys.stderr.write(line)
            sys.stderr.flush()
    except Exception:  # noqa: BLE001 - logging must never fail a verb
        pass


def info(msg: str, **fields: object) -> None:
    event("info", msg, **fields)


def warn(msg: str, **fields: object) -> None:
    event("warning", msg, **fields)
