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


def loads(data: str | bytes, pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """Parse one JSON document (bytes are UTF-8). ValueError (or RecursionError) when it is not one. With
    `pairs_hook`, each object is what it makes of the object's (key, value) pairs, in order, duplicates too."""
    scan = _scan
    if pairs_hook is not None:
        context = _Context()
        context.object_pairs_hook = pairs_hook  # type: ignore[assignment]
        scan = _json.make_scanner(context)  # type: ignore[arg-type]
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    n = len(text)
    start = 0
    while start < n and text[start] in _WHITESPACE:
        start += 1
    try:
        try:
            value, end = scan(text, start)
        except SystemError:
            # _json builds its error from json.decoder.JSONDecodeError, and finds it only when json.decoder is
            # imported already (CPython up to 3.12): on this error path only, import it and parse again
            import json.decoder  # noqa: F401

            value, end = scan(text, start)
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


class Raw:
    """A value given with its JSON text (one line): dumps_raw writes the text as it is instead of encoding the
    value again (a sweep journals thousands of rules and records it has just read as JSON)."""

    __slots__ = ("text", "value")

    def __init__(self, text: str, value: Any) -> None:
        self.text, self.value = text, value


_MARK = "\x01cni-reaper raw\x01"
_MARKED = '"\\u0001cni-reaper raw\\u0001"'  # how the encoder writes _MARK


def dumps_raw(obj: Any) -> str:
    """dumps(), with each Raw written as its text (or, should the text of the rest hold the mark, its value)."""
    texts: list[str] = []

    def raw(o: Any) -> Any:
        if type(o) is not Raw:
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
        texts.append(o.text)
        return _MARK

    out = "".join(_encoder(raw)(obj, 0))
    if not texts:
        return out
    parts = out.split(_MARKED)
    if len(parts) != len(texts) + 1:  # the mark was in the data itself: every value encoded again
        return "".join(_encoder(lambda o: o.value if type(o) is Raw else raw(o))(obj, 0))
    pieces = [parts[0]]
    for text, part in zip(texts, parts[1:]):
        pieces += (text, part)
    return "".join(pieces)


def raw_line(text: str) -> bool:
    """Whether `text` (a JSON value as read) can stand in one line of a JSON-lines file as it is."""
    return "\n" not in text and "\r" not in text


def tagged_items(text: str, key: str) -> list[tuple[str, Any, str]] | None:
    """The elements of a document `{"<key>": [{"<tag>": <value>}, ...]}` (what `nft -j list` prints), each as
    (tag, value, the value's own text), parsed once; None when the text is not of that shape (the caller
    then parses it whole, and reports what is wrong with it)."""
    n = len(text)

    def skip(i: int) -> int:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        return i

    def expect(i: int, c: str) -> int:
        if i >= n or text[i] != c:
            raise ValueError(c)
        return skip(i + 1)

    out: list[tuple[str, Any, str]] = []
    try:
        i = expect(skip(0), "{")
        name, i = _scan(text, i)
        i = expect(expect(skip(i), ":"), "[")
        more = name == key and i < n and text[i] != "]"
        while more:
            i = expect(i, "{")
            tag, i = _scan(text, i)
            i = expect(skip(i), ":")
            value, end = _scan(text, i)
            if type(tag) is not str:
                return None
            out.append((tag, value, text[i:end]))
            i = expect(skip(end), "}")
            more = i < n and text[i] == ","
            if more:
                i = skip(i + 1)
        if name != key or expect(expect(i, "]"), "}") != n:
            return None
    except (StopIteration, ValueError, SystemError, RecursionError):
        return None
    return out
