"""The counters (state/counters.py) and their text (tools/metrics.py): what a clean-up adds, that a damaged counter file restarts them instead of
failing anything, several state directories merged, and text that a real Prometheus parser reads."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from cni_reaper.reap.outcome import Outcome
from cni_reaper.state import counters as metrics
from cni_reaper.state.store import Store
from cni_reaper.tools.metrics import exposition, merge
from cni_reaper.values import Key


def _outcome(network="n", kinds=(("masquerade", 2), ("reservation", 1)), failed=False) -> Outcome:
    out = Outcome()
    for kind, n in kinds:
        out.note(Key(network, "c1", "eth0"), f"{kind} item", kind, n)
    if failed:
        out.failed.add(Key(network, "c2", "eth0"))
        out.errors.append("ipv4: boom")
    return out


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_sweep_adds_to_the_counters_and_the_histogram():
    c = metrics.count(metrics.empty(), _outcome(), {"n": 1}, 0.03, "DEL", now=100.0)
    c = metrics.count(c, _outcome(failed=True), {}, 7.0, "DEL", now=200.0)
    got = _samples(exposition(c, {("n", "live"): 3}, ["n", "quiet"]))
    assert got[("cni_reaper_removed_total", (("kind", "masquerade"), ("network", "n")))] == 4
    assert got[("cni_reaper_removed_total", (("kind", "reservation"), ("network", "n")))] == 2
    assert got[("cni_reaper_attachments_cleaned_total", (("network", "n"),))] == 1
    assert got[("cni_reaper_attachments_cleaned_total", (("network", "quiet"),))] == 0  # shown at zero
    assert got[("cni_reaper_cleanup_failures_total", (("network", "n"),))] == 1
    assert got[("cni_reaper_cleanup_errors_total", ())] == 1
    assert got[("cni_reaper_sweep_duration_seconds_count", (("verb", "DEL"),))] == 2
    assert got[("cni_reaper_sweep_duration_seconds_bucket", (("le", "0.05"), ("verb", "DEL")))] == 1
    assert got[("cni_reaper_sweep_duration_seconds_bucket", (("le", "+Inf"), ("verb", "DEL")))] == 2
    assert math.isclose(got[("cni_reaper_sweep_duration_seconds_sum", (("verb", "DEL"),))], 7.03)
    assert got[("cni_reaper_last_sweep_timestamp_seconds", ())] == 200.0
    assert got[("cni_reaper_last_failure_timestamp_seconds", ())] == 200.0
    assert got[("cni_reaper_records", (("network", "n"), ("state", "live")))] == 3
    assert got[("cni_reaper_records", (("network", "n"), ("state", "dead")))] == 0


def test_counters_of_several_state_directories_add_up():
    a = metrics.count(metrics.empty(), _outcome("x"), {"x": 1}, 0.1, "ADD", now=5.0)
    b = metrics.count(metrics.empty(), _outcome("x"), {"x": 2}, 0.2, "ADD", now=9.0)
    b = metrics.count(b, _outcome("y"), {"y": 1}, 0.2, "GC", now=11.0)
    a["unrecorded"], b["unrecorded"] = 2, 1
    m = merge([a, b])
    assert m["unrecorded"] == 3  # ADDs that passed through without a record, in either state directory
    assert m["attachments"] == {"x": 3, "y": 1} and m["removed"]["x"]["masquerade"] == 4
    assert m["sweeps"]["ADD"]["count"] == 2 and m["lastSweep"] == 11.0 and m["lastFailure"] is None


def test_a_damaged_counter_file_restarts_the_counters(tmp_path):
    store = Store(str(tmp_path / "s")).open()
    with store.locked():
        for junk in (b"", b"{", b"[]", b'{"version": 1, "removed": 3}', b'{"version": 99}', b"\xff\xfe"):
            store.dir.write(metrics.FILE, junk)
            counters = metrics.load(store)
            assert counters["removed"] == {} and counters["version"] == metrics.VERSION
        metrics.add(store, _outcome(), {"n": 1}, 0.01)  # and adding to it works again
        assert metrics.load(store)["attachments"] == {"n": 1}
        metrics.add(store, _outcome(), {"n": 1}, 0.01)
        assert metrics.load(store)["attachments"] == {"n": 2}
    assert not [p.name for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp.")]  # no temp file left


@settings(max_examples=200, deadline=None)
@given(networks=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=4, unique=True),
       counts=st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=4))
def test_any_network_name_gives_text_prometheus_reads_back(networks, counts):
    """Label values are escaped (quotes, backslashes, newlines): what is parsed is what was counted."""
    c = metrics.empty()
    for network, n in zip(networks, counts * len(networks)):
        c = metrics.count(c, _outcome(network, (("dnat", n),)), {network: n}, 0.5, "sweep", now=1.0)
    got = _samples(exposition(c, {}, networks))
    for network, n in zip(networks, counts * len(networks)):
        assert got[("cni_reaper_removed_total", (("kind", "dnat"), ("network", network)))] == n
        assert got[("cni_reaper_attachments_cleaned_total", (("network", network),))] == n


def test_the_counter_file_is_json_a_person_can_read(tmp_path):
    store = Store(str(tmp_path / "s")).open()
    with store.locked():
        metrics.add(store, _outcome(), {"n": 1}, 0.01)
    doc = json.loads((tmp_path / "s" / metrics.FILE).read_text())
    assert doc["attachments"] == {"n": 1} and doc["removed"]["n"] == {"masquerade": 2, "reservation": 1}


def test_the_schedulers_word_keeps_the_latest_answer_and_the_latest_unavailability(tmp_path):
    """sweep --nomad notes when the agent last answered all it was asked and when it last could not: the alert
    on a word that stays unavailable compares the two (build/monitoring); counters of an older cni-reaper,
    without them, show 0."""
    store = Store(str(tmp_path / "s")).open()
    with store.locked():
        metrics.word_asked(store, True, 10.0)
        metrics.word_asked(store, False, 20.0)
        metrics.word_asked(store, True, 5.0)  # an earlier question finishing late does not go back in time
        mine = metrics.load(store)
    older = metrics.empty()
    del older["wordAnswered"], older["wordUnavailable"]
    got = _samples(exposition(merge([mine, older]), {}, []))
    assert got[("cni_reaper_schedulers_word_answered_timestamp_seconds", ())] == 10.0
    assert got[("cni_reaper_schedulers_word_unavailable_timestamp_seconds", ())] == 20.0
    got = _samples(exposition(merge([older]), {}, []))
    assert got[("cni_reaper_schedulers_word_answered_timestamp_seconds", ())] == 0.0
