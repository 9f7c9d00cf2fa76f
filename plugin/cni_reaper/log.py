"""Diagnostics. In CNI mode stdout belongs to the protocol, so every line goes to stderr as one JSON object.

A failure to log never fails a verb.
"""

from __future__ import annotations

import json
import sys
import time

_context: dict[str, str] = {}


def bind(**fields: str) -> None:
    """Fields added to every later line (verb, network, container ID)."""
    _context.update({k: v for k, v in fields.items() if v})


def event(level: str, msg: str, **fields: object) -> None:
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "level": level, "msg": msg}
    line.update(_context)
    line.update(fields)
    try:
        sys.stderr.write(json.dumps(line, default=str) + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - logging must never fail a verb
        pass


def info(msg: str, **fields: object) -> None:
    event("info", msg, **fields)


def warn(msg: str, **fields: object) -> None:
    event("warning", msg, **fields)
