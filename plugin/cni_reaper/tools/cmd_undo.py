"""`cni-reaper undo CONTAINER_ID [--dry-run]`: put back what clean-ups removed for a container, unless
something live holds it (reap/undo.py, through the engine)."""

from __future__ import annotations

import os

from cni_reaper import log
from cni_reaper.tools import context
from cni_reaper.tools.cmd_journal import described
from cni_reaper.tools.exits import EXIT_LEFT, EXIT_OK
from cni_reaper.tools.printed import print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.tools.context import Context


def run(args) -> int:
    contexts, skipped = context.contexts(args)
    log.begin(contexts[0].conf.logFile if not args.dry_run else None, stderr=False, verb="undo")
    restored, refused, lost = _undo(args, contexts)
    for item, _ in restored:
        log.info("put back" if not args.dry_run else "would put back", containerID=args.container_id,
                 item=described(item))
    if args.json:
        print_json("undo", {"dryRun": args.dry_run, "restored": [described(i) for i, _ in restored],
                            "refused": [{"item": described(i), "why": why} for i, why in refused],
                            "cannotRestore": [described(i) for i in lost]})
    else:
        _print_undo(args.dry_run, args.container_id, restored, refused, lost)
    return EXIT_LEFT if refused or skipped else EXIT_OK


def _undo(args, contexts: list[Context]) -> tuple[list[tuple[dict, str]], list[tuple[dict, str]], list[dict]]:
    """Each state directory's undo, under its lock: what was put back (and how), refused (and why), and what
    can never be put back."""
    from cni_reaper.reap import engine
    from cni_reaper.state.store import Store

    restored, refused, lost = [], [], []
    for state_dir, group in context.by_state_dir(contexts).items():
        if not os.path.isdir(state_dir):
            continue
        store = Store(state_dir, group[0].conf.lockTimeout).open(create=False)
        try:
            with store.locked():
                report = engine.undo(store, args.container_id, args.dry_run, [c.conf.ipamDataDir for c in group],
                                     {c.network: c.conf for c in group if c.network}, group[0].conf.cniCacheDir)
        finally:
            store.close()
        restored += [(e.item, what) for e, what in report.restored]
        refused += [(e.item, why) for e, why in report.refused]
        lost += [e.item for e in report.unrestorable] + [e.item for e, _ in report.gone]
    return restored, refused, lost


def _print_undo(dry_run: bool, cid: str, restored: list, refused: list, lost: list) -> None:
    verb = "would put back" if dry_run else "put back"
    for item, what in restored:
        print(f"{verb}: {described(item)}" + (f" ({what})" if what in ("already there", "already back") else ""))
    for item, why in refused:
        print(f"not put back: {described(item)}: {why}")
    for item in lost:
        print(f"cannot be put back: {described(item)}")
    if not (restored or refused or lost):
        print(f"nothing of {cid} to put back (the journal has nothing, or it was undone)")
