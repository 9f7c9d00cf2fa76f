"""`cni-reaper journal [CONTAINER_ID]`: what clean-ups removed (and undo put back), from the journal."""

from __future__ import annotations

import os
import time

from cni_reaper.tools import context
from cni_reaper.tools.exits import EXIT_ERROR, EXIT_OK
from cni_reaper.tools.printed import print_json

# how each kind of journal item reads to an operator
_WORDS = {
    "iptables": lambda i: f"ipv{i['family']} {i['flavour']} {i['table']} {i['chain']}: {i.get('what', '')}",
    "nft": lambda i: f"nft {i['family']} {i['table']} {i['chain']}: {i.get('what', '')}",
    "reservation": lambda i: f"host-local reservation {i['network']}/{i['ip']} ({i['dataDir']})",
    "cache": lambda i: f"libcni's cached result {i['entry']} (its addresses forgotten)",
    "conntrack": lambda i: f"conntrack: {i['entries']} entries of {i['ip']} cleared (cannot be put back)",
    "netns": lambda i: f"network namespace {i['netns']} removed on Nomad's word (cannot be put back)",
    "record": lambda i: "the record",
}


def described(item: dict) -> str:
    """One journal item as an operator reads it."""
    words = _WORDS.get(item.get("kind", ""))
    return words(item) if words is not None else str(item.get("kind"))


def run(args) -> int:
    contexts, skipped = context.contexts(args)
    rows = [row for state_dir in context.by_state_dir(contexts) for row in _rows(state_dir, args.container_id)]
    if args.json:
        print_json("journal", rows)
    elif not rows:
        print("the journal has nothing" + (f" of {args.container_id}" if args.container_id else ""))
    else:
        for r in rows:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r["at"]))
            state = " (undone)" if r["undone"] else ("" if r["removed"] == "yes" else " (perhaps: the clean-up was cut)")
            print(f"{at} {r['verb'] or '-':6} {' '.join(r['key']).strip()}: {r['what']}{state}")
    return EXIT_ERROR if skipped else EXIT_OK


def _rows(state_dir: str, cid: str | None) -> list[dict]:
    """`journal --json`'s items of one state directory (of `cid`'s attachments, or every one)."""
    from cni_reaper.state import journal
    from cni_reaper.state.store import Store

    if not os.path.isdir(state_dir):
        return []
    store = Store(state_dir).open(create=False, read_only=True)
    try:
        return [{"at": e.at, "verb": e.verb, "key": e.item["key"], "kind": e.item.get("kind"),
                 "what": described(e.item), "removed": "yes" if e.sure else "perhaps (no done)",
                 "undone": e.restored, "stateDir": state_dir, "item": e.item} for e in journal.items(store, cid)]
    finally:
        store.close()
