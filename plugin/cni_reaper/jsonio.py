"""JSON in and out for the hot path, on the C accelerator `_json` alone.

The `json` package imports `re` (and with it `enum`), which costs about 7 ms per process here, a third of a
whole ADD; its C accelerator parses and encodes without either. `loads` and `dumps` here give what
json.loads and json.dumps give (tests/unit/test_jsonio.py holds them together): the same values, the same
errors (ValueError), NaN and Infinity accepted as `json` accepts them; `dumps` writes the compact form.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any, Callable

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
_WHITESPACE = " \t\n\r"


class _Context:
    """What the C scanner reads from a JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__



_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # any object with these attributes


def loads(data: str | bytes) -> Any:
    """Parse one JSON document (bytes are UTF-8). ValueError (or RecursionError) when it is not one."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    n = len(text)
    start = 0
    while start < n and text[start] in _WHITESPACE:
        start += 1
    try:
        try:
            value, end = _scan(text, start)
        except SystemError:
            # _json builds its error from json.decoder.JSONDecodeError, and finds it only when json.decoder is
            # imported already (CPython up to 3.12): on this error path only, import it and parse again
            import json.decoder  # noqa: F401

            value, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"Expecting value: char {exc.value}") from None
    while end < n and text[end] in _WHITESPACE:
        end += 1
    if end != n:
        raise ValueError(f"Extra data: char {end}")
    return value


def _encoder(default: Callable[[Any], Any] | None) -> Callable[[Any, int], Any]:
    def fail(o: Any) -> Any:
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    return _json.make_encoder(None, default or fail, _json.encode_basestring_ascii, None, ":", ",", False, False,
                              True)


_plain = _encoder(None)
_as_text = _encoder(str)  # the log's: made once, not once a line


def dumps(obj: Any, default: Callable[[Any], Any] | None = None) -> str:
    """The compact JSON text of obj (ASCII, as json.dumps writes by default)."""
    enc = _plain if default is None else _as_text if default is str else _encoder(default)
    return "".join(enc(obj, 0))
