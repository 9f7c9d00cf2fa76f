"""`cni-reaper metrics [--textfile DIR]`: the counters of the clean-ups and the records by state, in the
Prometheus text format (tools/metrics.py writes it)."""

from __future__ import annotations

import os
import sys

from cni_reaper import PLUGIN_NAME
from cni_reaper.tools import context
from cni_reaper.tools.exits import EXIT_ERROR, EXIT_OK

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.tools.context import Context


def run(args) -> int:
    from cni_reaper.tools import metrics

    contexts, skipped = context.contexts(args)
    counters, records = _read(contexts)
    merged = metrics.merge(counters)
    if args.network:
        merged, records = _only(args.network, merged, records)
    text = metrics.exposition(merged, records, [c.network for c in contexts if c.network])
    if not args.textfile:
        sys.stdout.write(text)
        return EXIT_ERROR if skipped else EXIT_OK
    try:
        written = metrics.write_textfile(args.textfile, text)
    except OSError as exc:
        print(f"{PLUGIN_NAME}: cannot write {args.textfile}/cni_reaper.prom: {exc.strerror}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{PLUGIN_NAME}: wrote {written}", file=sys.stderr)
    return EXIT_ERROR if skipped else EXIT_OK


def _only(network: str, merged: dict, records: dict[tuple[str, str], int]) -> tuple[dict, dict[tuple[str, str], int]]:
    """The counters and the records of one network alone (--network)."""
    merged = {**merged, **{part: {n: v for n, v in merged[part].items() if n == network}
                           for part in ("attachments", "removed", "failures")}}
    return merged, {k: v for k, v in records.items() if k[0] == network}  # (network, state)


def _read(contexts: list[Context]) -> tuple[list[dict], dict[tuple[str, str], int]]:
    """Each state directory's counters, and how many records each (network, state) has, judged as every pass
    judges them."""
    from cni_reaper.judge import DEAD, EXPIRED, HELD, LEFT, LIVE, UNKNOWN
    from cni_reaper.reap.engine import host_view
    from cni_reaper.state.counters import shown as load_counters
    from cni_reaper.state.store import Store

    word = {LIVE: "live", DEAD: "dead", EXPIRED: "dead", UNKNOWN: "unknown", LEFT: "left", HELD: "held"}
    counters: list[dict] = []
    records: dict[tuple[str, str], int] = {}
    view = host_view()
    for state_dir, group in context.by_state_dir(contexts).items():
        if not os.path.isdir(state_dir):
            continue
        store = Store(state_dir).open(create=False, read_only=True)
        try:
            counters.append(load_counters(store))
            found = list(store.records())
        finally:
            store.close()
        states = context.states(found, group, view)
        for r in found:
            which = (r.network, word.get(states[r.key][0], "torn_down"))
            records[which] = records.get(which, 0) + 1
    return counters, records
