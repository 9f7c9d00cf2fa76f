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
from cni_reaper.files import open_regular, untrusted

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
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    except OSError:
        return
    why = untrusted(os.fstat(fd), f"the log file {path}")
    if why:  # never written to: someone else could make it anything (a link into root's files was refused above)
        os.close(fd)
        _settings.update(file="")
        sys.stderr.write(_line("error", "the log file is refused: it must be root's and writable by root alone",
                               {"why": why, "fix": f"chown root {path} && chmod 0640 {path}, or set logFile to another"}))
        return
    try:
        if os.fstat(fd).st_size > MAX_BYTES:
            try:
                os.rename(path, path + ".1")
            except OSError:
                pass
            os.close(fd)
            fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        os.write(fd, line.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def _line(level: str, msg: str, fields: dict[str, object]) -> str:
    now = int(time.time())
    if _stamp[0] != now:  # one strftime a second, not one a line (a sweep of 1,000 writes 2,000)
        _stamp[:] = [now, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))]
    entry: dict[str, object] = {"time": _stamp[1], "level": level, "msg": msg}
    entry.update(_context)
    entry.update(fields)
    return jsonio.dumps(entry, default=str) + "\n"


_stamp: list[Any] = [None, ""]


def _write(level: str, text: str) -> None:
    if _settings["file"]:
        _to_file(_settings["file"], text)
    if _settings["stderr"] and _LEVELS.get(level, 1) >= _LEVELS["info"]:
        sys.stderr.write(text)
        sys.stderr.flush()


def event(level: str, msg: str, **fields: object) -> None:
    try:
        _write(level, _line(level, msg, fields))
    except Exception:  # noqa: BLE001 - logging must never fail a verb
        pass


def each(level: str, msg: str, rows: list[dict[str, Any]]) -> None:
    """One line per row (its fields), written together: one append to the file and one to stderr for a
    sweep's thousand lines (a single write: another process's lines never land among them)."""
    if rows:
        try:
            _write(level, "".join([_line(level, msg, r) for r in rows]))
        except Exception:  # noqa: BLE001 - logging must never fail a verb
            pass


def info(msg: str, **fields: object) -> None:
    event("info", msg, **fields)


def warn(msg: str, **fields: object) -> None:
    event("warning", msg, **fields)


def error(msg: str, **fields: object) -> None:
    event("error", msg, **fields)
