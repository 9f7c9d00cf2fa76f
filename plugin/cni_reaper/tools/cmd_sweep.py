"""`cni-reaper sweep [--apply] [--orphans] [--nomad]`: what dead attachments left, shown or removed, by the one
engine (reap/engine.operator_pass) with the operator's selection: every record, the scheduler's word, the
orphans."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.reap.engine import Outcome
    from cni_reaper.state.record import Record
    from cni_reaper.tools.context import Context

from cni_reaper import log
from cni_reaper.tools import context
from cni_reaper.tools.exits import EXIT_BLIND, EXIT_ERROR, EXIT_FOUND, EXIT_LEFT, EXIT_OK
from cni_reaper.tools.printed import print_json


def run(args) -> int:
    from cni_reaper.reap import engine

    contexts, skipped = context.contexts(args)
    log.begin(contexts[0].conf.logFile if args.apply else None, stderr=False, verb="sweep")
    total = engine.outcome()
    view = engine.host_view(at_once=True)  # what something not ours held is looked at now, not at its retry time
    by_dir = list(context.by_state_dir(contexts).values())
    # asked before any state lock is taken: no ADD waits on Nomad's API
    word = engine.ask_word(args, lambda: [r for g in by_dir for r in context.glance(g[0])], view)  # and /proc
    for group in by_dir:
        if args.apply:
            log.begin(group[0].conf.logFile, stderr=False, verb="sweep")
        sweep_group(args, group, total, view, word)
    total.unknown = dict(view.blind)
    groups = {f"{key.network} {key.container_id}" + (f" {key.ifname}" if key.ifname else ""): items
              for key, items in total.removed.items()}
    count = sum(len(v) for v in groups.values())
    backends = {f"ipv{f}": name for f, name in sorted(total.backends.items())}
    if args.json:
        print_json("sweep", _as_json(args.apply, groups, count, total, backends, contexts))
    else:
        _print_sweep(args.apply, groups, count, total, backends)
    return _sweep_exit(args.apply, total, count, skipped)


def _as_json(applied: bool, groups: dict[str, list[str]], count: int, total: Outcome, backends: dict[str, str],
             contexts: list[Context]) -> dict:
    """`sweep --json`'s document (docs/reference.md)."""
    return {"applied": applied, "attachments": groups, "count": count, "errors": total.errors,
            "skipped": total.skipped, "unknown": total.unknown, "backends": backends,
            "held": {" ".join(k).strip(): why for k, why in total.held.items()},
            "observed": {" ".join(k): v for k, v in total.would.items()},
            "networks": [c.network for c in contexts if c.network]}


def _sweep_exit(applied: bool, total: Outcome, count: int, skipped: bool) -> int:
    """`sweep`'s exit code, the worst of what it met (README, "Exit codes")."""
    if total.errors or total.unverified:
        return EXIT_LEFT if applied else EXIT_ERROR
    if total.held and applied:
        return EXIT_LEFT
    if skipped:
        return EXIT_ERROR
    if total.unknown:
        return EXIT_BLIND
    if (not applied and count) or total.would:
        return EXIT_FOUND
    return EXIT_OK


def _print_items(heading: str, items: list[str]) -> None:
    print(heading)
    for item in items:
        print(f"  - {item}")


def _print_sweep(applied: bool, groups: dict[str, list[str]], count: int, total: Outcome,
                 backends: dict[str, str]) -> None:
    verb = "removed" if applied else "would remove"
    for owner, items in groups.items():
        _print_items(f"{owner}: {verb} {len(items)}", items)
    for key, items in total.would.items():
        _print_items(f"{' '.join(key).strip()}: would remove {len(items)} (its network is in observe mode: nothing "
                     "removed)", items)
    _print_problems(total)
    print(f"{count} item(s) of {len(groups)} attachment(s) {verb}" +
          ("" if applied or not count else "; run again with --apply to remove them"))
    if backends:
        print("backends: " + ", ".join(f"{f} {n}" for f, n in backends.items()))


def _print_problems(total: Outcome) -> None:
    """What the sweep could not do or judge, and why, on stderr."""
    for err in total.errors:
        print(f"error: {err}", file=sys.stderr)
    for why in total.skipped:
        print(f"left on purpose: {why}", file=sys.stderr)
    for key, why in total.held.items():
        print(f"{' '.join(key).strip()}: left in place, something not ours holds it: {why} (its record is kept; "
              "remove what holds it, then sweep again)", file=sys.stderr)
    for why, n in sorted(total.unknown.items()):
        print(f"cannot judge {n} attachment(s): {why}; nothing that depends on it was removed "
              "(run where the runtime runs: the host's mount and network namespaces, /proc mounted)", file=sys.stderr)


def sweep_group(args, group: list[Context], total: Outcome, view, word=None) -> None:
    """Sweep the networks of one state directory under its lock: each record with its own settings (a record
    of cni-reaper 0.2 with its network's conflist, or the first one's when no conflist names its network any
    more); with --orphans, the tagged attachments without a record that libcni's cache or host-local proves
    dead (engine.orphans_of)."""
    from cni_reaper.reap import engine
    from cni_reaper.state.store import Store

    first = group[0]
    store = None
    if os.path.isdir(first.conf.stateDir):
        # a dry run (and doctor's look at the leaks) reads only: a mode other than 0700 is left as it is
        store = Store(first.conf.stateDir, first.conf.lockTimeout).open(create=False, read_only=not args.apply)
    try:
        with store.locked() if store is not None else context.NoLock():
            records = list(store.records()) if store is not None else []
            runs = _sweep_runs(args, group, records)
            confs = {n: conf for conf, n in runs if n}
            modes = context.modes_of(store, group, context.settings_of(args))
            said = engine.word_verdicts(word, records, view, args.apply, args, modes, store)
            for conf, network in runs:
                extra = _orphans(group, records, conf, network, view) if args.orphans else None
                outcome = engine.operator_pass(store, conf, records, view, confs, modes, not args.apply, network,
                                               said.verdicts, extra)
                if args.apply and store is not None:
                    said.count(store, outcome.removed)
                total.merge(outcome)
    finally:
        if store is not None:
            store.close()


def _sweep_runs(args, group: list[Context], records: list[Record]) -> list[tuple]:
    """(configuration, network) of each run of a group's sweep: each context's, and (unless one network is
    asked for) the first one's for every network its records name that no conflist does any more."""
    first = group[0]
    runs = [(c.conf, c.network) for c in group]
    if first.network is not None and not args.network:
        named = {c.network for c in group}
        runs += [(first.conf, n) for n in sorted({r.network for r in records} - named)]
    return runs


def _orphans(group: list[Context], records: list[Record], conf, network: str | None, view) -> list:
    """The orphans of `network`, where its conflist (if one names it) says host-local keeps it."""
    from cni_reaper.reap import engine

    named = next((c for c in group if c.network == network), None)
    return engine.orphans_of(conf, records, network, named.keeping if named else engine.keeping(), view)
