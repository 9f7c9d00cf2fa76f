"""What the clean-ups did, counted: kept in the state directory (`.metrics`); tools/metrics.py shows them in
the Prometheus text format (`cni-reaper metrics`).

Only a sweep that cleans something (or a CLI `sweep --apply`) adds to the counters, under the state lock, in
one atomic replace of one small file: ADD, CHECK and DEL with nothing stale never touch it. A counter file
that cannot be read starts the counters again from zero (Prometheus sees a counter reset, which its rate()
handles); a failure to write one is logged and never fails a verb.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.reap.outcome import Outcome
    from cni_reaper.state.store import Store

from cni_reaper import jsonio, log

FILE = ".metrics"
MAX_BYTES = 4 << 20
VERSION = 1
# Items removed, by kind: iptables rules and chains of bridge's ipMasq, portmap and firewall, the rules in
# the native nftables tables of plugins 1.6+, host-local reservations, conntrack entries.
KINDS = ("masquerade", "dnat", "firewall", "nftables_masquerade", "nftables_dnat", "reservation", "conntrack")
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # seconds, the sweep durations


def empty() -> dict:
    return {"version": VERSION, "since": time.time(), "attachments": {}, "removed": {}, "failures": {},
            "errors": 0, "sweeps": {}, "lastSweep": None, "lastFailure": None, "wouldRemove": {}, "schedulersWord": {},
            "unrecorded": 0, "wordAnswered": None, "wordUnavailable": None}


def parse(data: bytes | None) -> dict:
    """The counters of a `.metrics` file; fresh ones when there is none or it cannot be used."""
    try:
        doc = jsonio.loads(data) if data else None
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return empty()
    base = empty()
    for k, v in base.items():
        if type(doc.get(k)) is not type(v) and not (v is None and isinstance(doc.get(k), (int, float))):
            doc[k] = v
    return doc


def load(store: Store) -> dict:
    data, _ = store.dir.read(FILE, MAX_BYTES)
    return parse(data)


def count(counters: dict, outcome, cleaned: dict[str, int], seconds: float, verb: str, now: float) -> dict:
    """`counters` with one sweep added: its outcome (cleanup.Outcome), the attachments it cleaned per network,
    how long it took, and which verb ran it. Pure."""
    for network, n in cleaned.items():
        counters["attachments"][network] = counters["attachments"].get(network, 0) + n
    for (network, kind), n in outcome.counts.items():
        per = counters["removed"].setdefault(network, {})
        per[kind] = per.get(kind, 0) + n
    for network, _cid, _ifname in outcome.failed:
        counters["failures"][network] = counters["failures"].get(network, 0) + 1
    counters["errors"] += len(outcome.errors)
    s = counters["sweeps"].setdefault(verb or "unknown", {"count": 0, "sum": 0.0, "buckets": [0] * len(BUCKETS)})
    if len(s.get("buckets", ())) != len(BUCKETS):
        s["buckets"] = [0] * len(BUCKETS)
    s["count"] += 1
    s["sum"] += seconds
    for i, bound in enumerate(BUCKETS):
        if seconds <= bound:
            s["buckets"][i] += 1
    counters["lastSweep"] = now
    if outcome.errors or outcome.failed:
        counters["lastFailure"] = now
    return counters


def add_would(store: Store, counts: dict[tuple[str, str], int]) -> None:
    """Observe mode: what would have been removed, by network and kind (counted once per attachment and
    change). The caller holds the state lock. Never raises."""
    add_by_kind(store, "wouldRemove", counts)


def add_by_kind(store: Store, field: str, counts: dict[tuple[str, str], int]) -> None:
    """Add `counts` ((network, kind) -> n) to a counter by network and kind: `wouldRemove`, or
    `schedulersWord` (attachments cleaned and namespaces removed on Nomad's word). The caller holds the
    state lock. Never raises."""
    if not counts:
        return
    try:
        c = load(store)
        for (network, kind), n in counts.items():
            per = c[field].setdefault(network, {})
            per[kind] = per.get(kind, 0) + n
        store.dir.write(FILE, jsonio.dumps(c).encode(), durable=True)
    except Exception as exc:  # noqa: BLE001 - counting never fails a verb
        log.warn("metrics could not be counted", error=f"{type(exc).__name__}: {exc}")


def word_asked(store: Store, answered: bool, at: float) -> None:
    """A sweep --nomad asked the scheduler's word at `at`: `answered` (all of it), or not (the agent could not
    be reached, refused, or left something unproven: the sweep's exit 6). Kept as the latest time of each, for
    an alert on a word that stays unavailable. The caller holds the state lock. Never raises."""
    try:
        c = load(store)
        field = "wordAnswered" if answered else "wordUnavailable"
        c[field] = max(c.get(field) or 0.0, at)
        store.dir.write(FILE, jsonio.dumps(c).encode(), durable=True)
    except Exception as exc:  # noqa: BLE001 - counting never fails a verb
        log.warn("metrics could not be counted", error=f"{type(exc).__name__}: {exc}")


def add(store: Store, outcome: Outcome, cleaned: dict[str, int], seconds: float) -> None:
    """Add one sweep to the state directory's counters. The caller holds the state lock. Never raises."""
    try:
        counters = count(load(store), outcome, cleaned, seconds, log.field("verb") or "", time.time())
        store.dir.write(FILE, jsonio.dumps(counters).encode(), durable=True)
    except OSError:
        log.warn("metrics could not be written", stateDir=store.root)
    except Exception as exc:  # noqa: BLE001 - counting never fails a verb
        log.warn("metrics could not be counted", error=f"{type(exc).__name__}: {exc}")


UNRECORDED = ".unrecorded"  # a line per attachment an ADD could not record, appended with no lock


def unrecorded(state_dir: str) -> None:
    """Count an attachment that an ADD could not record (its own bookkeeping failed: a full disk, a lock held
    too long): a line appended to UNRECORDED, which takes no lock (the lock may be why it went unrecorded).
    Never raises, never waits."""
    from cni_reaper.state.store import Store

    try:
        store = Store(state_dir, 1.0).open(create=False)
        try:
            store.dir.append(UNRECORDED, b"1\n")
        finally:
            store.close()
    except Exception:  # noqa: BLE001 - a count that cannot be made is only a missing count
        pass


def shown(store: Store) -> dict:
    """The counters as `cni-reaper metrics` shows them: `.metrics`, and the ADDs counted in UNRECORDED."""
    counters = load(store)
    data, _ = store.dir.read(UNRECORDED, MAX_BYTES)
    counters["unrecorded"] += data.count(b"\n") if data else 0
    return counters
