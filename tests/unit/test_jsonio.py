"""jsonio (the hot path's JSON on `_json` alone) gives what the json module gives: the same values for every
document, the same refusals (ValueError), and text that json reads back as the same value."""

from __future__ import annotations

import json
import math
import os

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
