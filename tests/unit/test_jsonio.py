"""jsonio (the hot path's JSON on `_json` alone) gives what the json module gives: the same values for every
document, the same refusals (ValueError), and text that json reads back as the same value."""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import jsonio

EXAMPLES = int(os.environ.get("CNI_REAPER_SCHEMA_EXAMPLES", "1500"))
values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                                st.text(max_size=10)),
                      lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
                      max_leaves=20)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(values)
def test_round_trip_agrees_with_json(v):
    text = jsonio.dumps(v)
    assert same(json.loads(text), v)
    assert same(jsonio.loads(text), v)
    assert same(jsonio.loads(json.dumps(v, indent=2)), v)


def _parse(fn, text):
    try:
        return ("ok", fn(text))
    except (ValueError, RecursionError) as exc:
        return ("error", type(exc).__name__ if isinstance(exc, RecursionError) else "ValueError")


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(st.text(alphabet='{}[]",:0123456789.eE+-tfnrulsaINTy \t\n\\x\x01', max_size=30),
                 values.map(json.dumps).flatmap(lambda t: st.integers(0, len(t)).map(lambda i: t[:i] + t[i + 1:]))))
def test_every_text_is_accepted_or_refused_as_json_does(text):
    ours, theirs = _parse(jsonio.loads, text), _parse(json.loads, text)
    assert ours[0] == theirs[0], (text, ours, theirs)
    if ours[0] == "ok":
        assert same(ours[1], theirs[1])


def test_edges():
    for text in ["NaN", "-Infinity", " 1 ", "1e400", '"\\ud800"', "\ufeff{}", "{}\n", "[" * 50 + "]" * 50, "", "  "]:
        assert _parse(jsonio.loads, text)[0] == _parse(json.loads, text)[0], text
    assert jsonio.loads(b'{"a": "\\u00e9"}') == {"a": "é"}
    assert jsonio.dumps({"t": object}, default=lambda o: "x") == '{"t":"x"}'


def test_a_refusal_in_a_fresh_process_is_a_value_error():
    """_json builds its errors from json.decoder only when that is imported already: the hot path has not."""
    import subprocess
    import sys

    code = ("import sys\nfrom cni_reaper import jsonio\nassert 'json.decoder' not in sys.modules\n"
            "for t in ('{]', '[1,', '\"\\x01\"'):\n try: jsonio.loads(t)\n except ValueError: pass\n"
            " else: raise SystemExit('accepted ' + t)\nprint('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "ok", proc.stderr


# -- what the sweeps journal as read: nft's listings element by element, values written as their text --------
tagged_docs = st.lists(st.tuples(st.sampled_from(["rule", "table", "chain", "metainfo", "x,\"y"]), values), max_size=5)
spacings = st.sampled_from([(", ", ": "), (",", ":"), (" ,\n ", " : ")])
damages = st.sampled_from([None, "cut", "comma", "extra", "two-keys", "other-key", "not-object", "trailing"])


def _render(doc, sep, colon) -> str:
    items = sep.join("{" + json.dumps(tag) + colon + json.dumps(v, separators=(sep, colon)) + "}" for tag, v in doc)
    return "{" + json.dumps("nftables") + colon + "[" + items + "]}"


@pytest.mark.slow
@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(tagged_docs, spacings, damages)
def test_tagged_items_are_what_json_reads_or_none(doc, spacing, damage):
    """Each element's tag, value and text agree with json.loads of the whole; a document of another shape,
    or no JSON at all, gives None (the caller parses it whole then), never a wrong element."""
    text = _render(doc, *spacing)
    if damage == "cut":
        text = text[:len(text) // 2]
    elif damage == "comma":
        text = text.replace("}]", "},]")
    elif damage == "extra":
        text += " {}"
    elif damage == "two-keys" and doc:
        text = text.replace("}]", ', "b": 1}]', 1)
    elif damage == "other-key":
        text = text.replace('"nftables"', '"nft"', 1)
    elif damage == "not-object" and doc:
        text = text.replace("[{", "[[", 1)
    elif damage == "trailing":
        text = text + "\n\t "
    got = jsonio.tagged_items(text, "nftables")
    try:
        whole = json.loads(text)
    except ValueError:
        assert got is None
        return
    shaped = (type(whole) is dict and list(whole) == ["nftables"] and type(whole["nftables"]) is list
              and all(type(e) is dict and len(e) == 1 for e in whole["nftables"]))
    if not shaped:
        assert got is None
        return
    assert got is not None
    assert [(t, v) for t, v, _ in got] == [next(iter(e.items())) for e in whole["nftables"]]
    assert all(same(json.loads(raw), v) for _, v, raw in got)


@pytest.mark.slow
@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(values, max_size=4), values, st.booleans())
def test_dumps_raw_writes_the_text_of_each_raw_value(raws, rest, mark_in_data):
    """What dumps_raw writes reads back as the document with each Raw replaced by its text's value, whatever
    the rest holds (the mark itself included)."""
    spaced = [jsonio.Raw(json.dumps(v, indent=None, separators=(", ", ": ")), v) for v in raws]
    doc = {"items": spaced, "rest": rest, "mark": "\x01cni-reaper raw\x01" if mark_in_data else "m"}
    out = jsonio.dumps_raw(doc)
    assert "\n" not in out
    assert same(json.loads(out), {"items": raws, "rest": rest, "mark": doc["mark"]})
