"""What the clean-ups did, counted: kept in the state directory (`.metrics`) and shown in the Prometheus
text format (`cni-reaper metrics`).

Only a sweep that cleans something (or a CLI `sweep --apply`) adds to the counters, under the state lock, in
one atomic replace of one small file: ADD, CHECK and DEL with nothing stale never touch it. A counter file
that cannot be read starts the counters again from zero (Prometheus sees a counter reset, which its rate()
handles); a failure to write one is logged and never fails a verb.
"""

from __future__ import annotations

import os
import time

from cni_reaper import jsonio, log

FILE = ".metrics"
VERSION = 1
# Items removed, by kind: iptables rules and chains of bridge's ipMasq, portmap and firewall, the rules in
# the native nftables tables of plugins 1.6+, host-local reservations, conntrack entries.
KINDS = ("masquerade", "dnat", "firewall", "nftables_masquerade", "nftables_dnat", "reservation", "conntrack")
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # seconds, the sweep durations


def empty() -> dict:
    return {"version": VERSION, "since": time.time(), "attachments": {}, "removed": {}, "failures": {},
            "errors": 0, "sweeps": {}, "lastSweep": None, "lastFailure": None}


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


def load(store) -> dict:
    return parse(store.read_aux(FILE))


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


def add(store, outcome, cleaned: dict[str, int], seconds: float) -> None:
    """Add one sweep to the state directory's counters. The caller holds the state lock. Never raises."""
    try:
        counters = count(load(store), outcome, cleaned, seconds, log.field("verb") or "", time.time())
        if not store.write_aux(FILE, jsonio.dumps(counters).encode(), durable=True):
            log.warn("metrics could not be written", stateDir=store.root)
    except Exception as exc:  # noqa: BLE001 - counting never fails a verb
        log.warn("metrics could not be counted", error=f"{type(exc).__name__}: {exc}")


# -- the Prometheus text format (exposition format 0.0.4) --------------------------------------------
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


def merge(all_counters: list[dict]) -> dict:
    """The counters of several state directories as one (networks that share none are simply side by side)."""
    out = empty()
    out["since"] = min((c["since"] for c in all_counters), default=out["since"])
    for c in all_counters:
        for network, n in c["attachments"].items():
            out["attachments"][network] = out["attachments"].get(network, 0) + n
        for network, kinds in c["removed"].items():
            per = out["removed"].setdefault(network, {})
            for kind, n in kinds.items():
                per[kind] = per.get(kind, 0) + n
        for network, n in c["failures"].items():
            out["failures"][network] = out["failures"].get(network, 0) + n
        out["errors"] += c["errors"]
        for verb, s in c["sweeps"].items():
            o = out["sweeps"].setdefault(verb, {"count": 0, "sum": 0.0, "buckets": [0] * len(BUCKETS)})
            o["count"] += s["count"]
            o["sum"] += s["sum"]
            o["buckets"] = [a + b for a, b in zip(o["buckets"], s["buckets"])]
        for k in ("lastSweep", "lastFailure"):
            if c[k] is not None and (out[k] is None or c[k] > out[k]):
                out[k] = c[k]
    return out


def exposition(counters: dict, records: dict[tuple[str, str], int], networks: list[str]) -> str:
    """The text a Prometheus scrape (or node_exporter's textfile collector) reads. `records`: (network,
    state) -> how many records are in that state now; `networks`: the networks to show even at zero."""
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, dict, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            lines.append(f"{name}{suffix}{_labels(**labels)} {_num(value)}")

    shown = sorted(set(networks) | set(counters["attachments"]) | set(counters["removed"])
                   | set(counters["failures"]) | {n for n, _ in records})
    family("cni_reaper_attachments_cleaned_total", "counter",
           "Dead attachments whose leftovers cni-reaper removed (their records dropped).",
           [("", {"network": n}, counters["attachments"].get(n, 0)) for n in shown])
    family("cni_reaper_removed_total", "counter",
           "Leftovers removed, by kind: iptables rules and chains (masquerade, dnat, firewall), rules in the "
           "plugins' native nftables tables, host-local reservations, conntrack entries.",
           [("", {"network": n, "kind": k}, counters["removed"].get(n, {}).get(k, 0)) for n in shown for k in KINDS])
    family("cni_reaper_cleanup_failures_total", "counter",
           "Clean-ups of an attachment that left something behind (its record is kept and retried).",
           [("", {"network": n}, counters["failures"].get(n, 0)) for n in shown])
    family("cni_reaper_cleanup_errors_total", "counter",
           "Errors met while cleaning up (see the log file for each).", [("", {}, counters["errors"])])
    samples: list[tuple[str, dict, float]] = []
    for verb, s in sorted(counters["sweeps"].items()):
        for bound, n in zip(BUCKETS, s["buckets"]):
            samples.append(("_bucket", {"verb": verb, "le": repr(bound)}, n))
        samples.append(("_bucket", {"verb": verb, "le": "+Inf"}, s["count"]))
        samples.append(("_sum", {"verb": verb}, float(s["sum"])))
        samples.append(("_count", {"verb": verb}, s["count"]))
    family("cni_reaper_sweep_duration_seconds", "histogram",
           "Sweeps that cleaned something, by the verb (ADD, DEL, CHECK, STATUS, GC, sweep) that ran them.", samples)
    family("cni_reaper_last_sweep_timestamp_seconds", "gauge",
           "When a sweep last cleaned something (0: never).", [("", {}, float(counters["lastSweep"] or 0))])
    family("cni_reaper_last_failure_timestamp_seconds", "gauge",
           "When a clean-up last failed (0: never).", [("", {}, float(counters["lastFailure"] or 0))])
    family("cni_reaper_counters_since_timestamp_seconds", "gauge",
           "When the counters started (they restart if the state directory's .metrics is lost).",
           [("", {}, float(counters["since"]))])
    states = ("live", "dead", "torn_down")
    family("cni_reaper_records", "gauge",
           "Records by state: live (netns alive), dead (netns gone: cleaned on the next sweep), torn_down (DEL ran).",
           [("", {"network": n, "state": st}, records.get((n, st), 0)) for n in shown for st in states])
    return "\n".join(lines) + "\n"


def write_textfile(directory: str, text: str) -> str:
    """`<directory>/cni_reaper.prom`, replaced atomically: a reader sees the old file or the new one, never a
    part. node_exporter's textfile collector reads only `*.prom`, and the temp file's name does not end so;
    one left by a writer that was killed is removed by a later run once it is a minute old."""
    path = os.path.join(directory, "cni_reaper.prom")
    now = time.time()
    for name in os.listdir(directory):
        if name.startswith(".cni_reaper.prom."):
            try:
                if now - os.lstat(os.path.join(directory, name)).st_mtime > 60:
                    os.unlink(os.path.join(directory, name))
            except OSError:
                pass
    tmp = os.path.join(directory, f".cni_reaper.prom.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(text.encode())
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
