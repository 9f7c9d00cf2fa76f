"""`cni-reaper list`: every record, and whether it is live, dead or torn down, judged as every pass judges it."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from cni_reaper.state.record import Record

from cni_reaper.tools import context
from cni_reaper.tools.exits import EXIT_ERROR, EXIT_OK
from cni_reaper.tools.printed import print_json


def run(args) -> int:
    from cni_reaper.reap.engine import host_view

    contexts, skipped = context.contexts(args)
    items = []
    view = host_view()
    for state_dir, group in context.by_state_dir(contexts).items():
        records = [r for r in context.records_in(state_dir) if not args.network or r.network == args.network]
        states = context.states(records, group, view)
        items += [_listed(r, *states[r.key], state_dir) for r in records]
    if args.json:
        print_json("list", items)
        return EXIT_ERROR if skipped else EXIT_OK
    if not items:
        print(f"no records in {', '.join(context.by_state_dir(contexts))}")
    else:
        _print_list(items)
    print(backends_line(contexts[0].conf.backend))
    return EXIT_ERROR if skipped else EXIT_OK


def _listed(r: Record, state: str, why: str, state_dir: str) -> dict:
    """`list`'s item of one record (its JSON form)."""
    cur = r.current
    return {
        "network": r.network, "containerID": r.container_id, "ifname": r.ifname,
        "ips": [ip.cidr for ip in cur.ips], "ports": [p.text for p in cur.port_mappings],
        "netns": cur.netns, "state": STATE_WORDS[state], "why": why,
        "earlierIPs": sorted({ip.cidr for life in r.earlier for ip in life.ips}),
        "createdAt": cur.created_at, "stateDir": state_dir,
    }


def _print_list(items: list[dict]) -> None:
    rows = [("NETWORK", "CONTAINER ID", "IFNAME", "IPS", "PORTS", "NETNS", "STATE")]
    rows += [(i["network"], i["containerID"], i["ifname"], ",".join(i["ips"]) or "-",
              ",".join(i["ports"]) or "-", i["netns"] or "-", i["state"]) for i in items]
    print(table(rows))
    for i in items:
        if i["state"] == "unknown":
            print(f"{i['containerID']}: cannot be judged: {i['why']}", file=sys.stderr)
        elif i["state"] == STATE_WORDS["held"]:
            print(f"{i['containerID']}: {i['why']}", file=sys.stderr)


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


STATE_WORDS = {"live": "live", "dead": "dead", "unknown": "unknown", "left": "dead (left for the runtime's DEL or GC)",
               "held": "dead (held by something not ours)",
               "tombstone-done": "torn down",
               "tombstone-expired": "torn down (DEL failed)", "tombstone-wait": "torn down (DEL running)"}


def backends_line(backend: str) -> str:
    """Which iptables each family's clean-up uses (each follows its own tool, as the plugins do)."""
    from cni_reaper.reap import probes

    parts = []
    for family in (4, 6):
        found, why = probes.iptables_of(backend, family)
        parts.append(f"ipv{family} {found or 'none'} ({why})")
    return "iptables: " + "; ".join(parts)
