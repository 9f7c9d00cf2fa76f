"""The clean-ups' counters (state/counters.py) and the records by state, in the Prometheus text format
(`cni-reaper metrics`), on stdout or as node_exporter's textfile."""

from __future__ import annotations

import os
import time

from cni_reaper.files import open_regular
from cni_reaper.state.counters import BUCKETS, KINDS, empty


# -- the Prometheus text format (exposition format 0.0.4) --------------------------------------------
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


def _add_flat(into: dict[str, int], more: dict[str, int]) -> None:
    for k, n in more.items():
        into[k] = into.get(k, 0) + n


def _add_nested(into: dict[str, dict[str, int]], more: dict[str, dict[str, int]]) -> None:
    for network, kinds in more.items():
        _add_flat(into.setdefault(network, {}), kinds)


def merge(all_counters: list[dict]) -> dict:
    """The counters of several state directories as one (networks that share none are simply side by side)."""
    out = empty()
    out["since"] = min((c["since"] for c in all_counters), default=out["since"])
    for c in all_counters:
        _add_flat(out["attachments"], c["attachments"])
        _add_nested(out["removed"], c["removed"])
        _add_flat(out["failures"], c["failures"])
        _add_nested(out["wouldRemove"], c.get("wouldRemove", {}))
        _add_nested(out["schedulersWord"], c.get("schedulersWord", {}))
        out["errors"] += c["errors"]
        out["unrecorded"] += c.get("unrecorded", 0)
        for verb, s in c["sweeps"].items():
            o = out["sweeps"].setdefault(verb, {"count": 0, "sum": 0.0, "buckets": [0] * len(BUCKETS)})
            o["count"] += s["count"]
            o["sum"] += s["sum"]
            o["buckets"] = [a + b for a, b in zip(o["buckets"], s["buckets"])]
        for k in ("lastSweep", "lastFailure", "wordAnswered", "wordUnavailable"):
            if c.get(k) is not None and (out[k] is None or c[k] > out[k]):
                out[k] = c[k]
    return out


def _by_kind(counts: dict, shown: list[str], kinds: tuple[str, ...]) -> list[tuple[str, dict, float]]:
    """The samples of a counter by network and kind, for the networks it has counted something of."""
    return [("", {"network": n, "kind": k}, counts.get(n, {}).get(k, 0)) for n in shown for k in kinds if n in counts]


class _Families:
    """The lines of an exposition, family by family."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, name: str, kind: str, help_text: str, samples: list[tuple[str, dict, float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            self.lines.append(f"{name}{suffix}{_labels(**labels)} {_num(value)}")


def exposition(counters: dict, records: dict[tuple[str, str], int], networks: list[str]) -> str:
    """The text a Prometheus scrape (or node_exporter's textfile collector) reads. `records`: (network,
    state) -> how many records are in that state now; `networks`: the networks to show even at zero."""
    shown = sorted(set(networks) | set(counters["attachments"]) | set(counters["removed"]) | set(counters["wouldRemove"])
                   | set(counters["failures"]) | {n for n, _ in records})
    out = _Families()
    _cleanup_families(out, counters, shown)
    _sweep_families(out, counters)
    states = ("live", "dead", "unknown", "left", "held", "torn_down")
    out.add("cni_reaper_records", "gauge",
            "Records by state: live (netns alive), dead (netns gone: cleaned on the next sweep), unknown (cannot be "
            "judged from where the metrics were read), left (dead, its leftovers wait for the runtime's DEL or GC), "
            "held (dead, something not ours holds a leftover: looked at again later), torn_down (DEL ran).",
            [("", {"network": n, "state": st}, records.get((n, st), 0)) for n in shown for st in states])
    return "\n".join(out.lines) + "\n"


def _cleanup_families(out: _Families, counters: dict, shown: list[str]) -> None:
    """What the clean-ups removed, would have removed, and failed to remove, by network."""
    out.add("cni_reaper_attachments_cleaned_total", "counter",
            "Dead attachments whose leftovers cni-reaper removed (their records dropped).",
            [("", {"network": n}, counters["attachments"].get(n, 0)) for n in shown])
    out.add("cni_reaper_removed_total", "counter",
            "Leftovers removed, by kind: iptables rules and chains (masquerade, dnat, firewall), rules in the "
            "plugins' native nftables tables, host-local reservations, conntrack entries.",
            [("", {"network": n, "kind": k}, counters["removed"].get(n, {}).get(k, 0)) for n in shown for k in KINDS])
    out.add("cni_reaper_would_remove_total", "counter",
            "Observe mode: leftovers cni-reaper would have removed (once per attachment and change), by kind.",
            _by_kind(counters.get("wouldRemove", {}), shown, KINDS))
    out.add("cni_reaper_schedulers_word_total", "counter",
            "On Nomad's word (sweep --nomad): attachments whose leftovers were removed because the local agent "
            "says their allocation is over, and network namespaces Nomad left that were removed.",
            _by_kind(counters.get("schedulersWord", {}), shown, ("attachments", "namespaces")))
    out.add("cni_reaper_cleanup_failures_total", "counter",
            "Clean-ups of an attachment that left something behind (its record is kept and retried).",
            [("", {"network": n}, counters["failures"].get(n, 0)) for n in shown])
    out.add("cni_reaper_cleanup_errors_total", "counter",
            "Errors met while cleaning up (see the log file for each).", [("", {}, counters["errors"])])


def _sweep_families(out: _Families, counters: dict) -> None:
    """The sweeps: what ADD could not record, how long sweeps took, when they last cleaned or failed."""
    out.add("cni_reaper_unrecorded_attachments_total", "counter",
            "Attachments an ADD passed through without a record (its own bookkeeping failed: a full state directory, "
            "the state lock held too long); they are judged as leaks from before installation. Counted when the "
            "state directory could still be written: see doctor's state-space check and the log's errors.",
            [("", {}, counters.get("unrecorded", 0))])
    out.add("cni_reaper_sweep_duration_seconds", "histogram",
            "Sweeps that cleaned something, by the verb (ADD, DEL, CHECK, STATUS, GC, sweep) that ran them.",
            _sweep_samples(counters))
    out.add("cni_reaper_last_sweep_timestamp_seconds", "gauge",
            "When a sweep last cleaned something (0: never).", [("", {}, float(counters["lastSweep"] or 0))])
    out.add("cni_reaper_last_failure_timestamp_seconds", "gauge",
            "When a clean-up last failed (0: never).", [("", {}, float(counters["lastFailure"] or 0))])
    out.add("cni_reaper_schedulers_word_answered_timestamp_seconds", "gauge",
            "sweep --nomad: when the local Nomad agent last answered all a sweep asked (0: never, or never asked).",
            [("", {}, float(counters.get("wordAnswered") or 0))])
    out.add("cni_reaper_schedulers_word_unavailable_timestamp_seconds", "gauge",
            "sweep --nomad: when a sweep last could not have the agent's whole word (unreachable, refused, or "
            "incomplete: the sweep's exit 6) (0: never).", [("", {}, float(counters.get("wordUnavailable") or 0))])
    out.add("cni_reaper_counters_since_timestamp_seconds", "gauge",
            "When the counters started (they restart if the state directory's .metrics is lost).",
            [("", {}, float(counters["since"]))])


def _sweep_samples(counters: dict) -> list[tuple[str, dict, float]]:
    samples: list[tuple[str, dict, float]] = []
    for verb, s in sorted(counters["sweeps"].items()):
        for bound, n in zip(BUCKETS, s["buckets"]):
            samples.append(("_bucket", {"verb": verb, "le": repr(bound)}, n))
        samples.append(("_bucket", {"verb": verb, "le": "+Inf"}, s["count"]))
        samples.append(("_sum", {"verb": verb}, float(s["sum"])))
        samples.append(("_count", {"verb": verb}, s["count"]))
    return samples


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
    fd = open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
