"""The operator's command line, in the same binary: used when a person runs it with arguments
(CNI mode, chosen by CNI_COMMAND, stays as it is).

    cni-reaper list [--json]
    cni-reaper sweep [--apply] [--orphans] [--network N] [--json]
    cni-reaper version

Exit codes: 0 clean (nothing to remove, or everything removed), 1 error, 2 usage,
3 a dry run found something to remove (run again with --apply), 4 --apply left something it could not remove.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

from . import PLUGIN_NAME, __version__, log
from .conf import DEFAULT_CNI_CACHE_DIR, DEFAULT_IPAM_DATA_DIR, DEFAULT_LOCK_TIMEOUT, DEFAULT_LOG_FILE, DEFAULT_STATE_DIR
from .errors import CniError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FOUND, EXIT_LEFT = 0, 1, 2, 3, 4


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 2, as documented
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="records (the conflist's stateDir)")
    p.add_argument("--cni-cache-dir", default=DEFAULT_CNI_CACHE_DIR, help="libcni's cache (cniCacheDir)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog=PLUGIN_NAME, description="Reap the netfilter rules and IP reservations of dead CNI attachments.",
                  epilog="Exit codes: 0 clean, 1 error, 2 usage, 3 dry run found something, 4 --apply left something. "
                         "As a CNI plugin it is run by the runtime with CNI_COMMAND set.")
    sub = top.add_subparsers(dest="command", metavar="{list,sweep,version}", parser_class=_Parser)
    p = sub.add_parser("list", help="every record, and whether it is live, dead or torn down")
    _common(p)
    p = sub.add_parser("sweep", help="show (default) or remove (--apply) what dead attachments left behind")
    _common(p)
    p.add_argument("--apply", action="store_true", help="remove; without it nothing is changed")
    p.add_argument("--orphans", action="store_true",
                   help="also rules tagged for containers with no record and no live netns (in libcni's cache)")
    p.add_argument("--network", help="only this network")
    p.add_argument("--ipam-data-dir", default=DEFAULT_IPAM_DATA_DIR, help="host-local's dataDir (ipamDataDir)")
    p.add_argument("--backend", choices=("auto", "nft", "legacy"), default="auto")
    p.add_argument("--log-file", default=DEFAULT_LOG_FILE, help='where --apply logs what it removed ("" for none)')
    p.add_argument("--lock-timeout", type=float, default=DEFAULT_LOCK_TIMEOUT, help="seconds to wait for the state lock")
    sub.add_parser("version", help="print the version")
    return top


def _conf(args, network: str = "cli"):
    """The flags as the configuration the verbs use (conf.Conf), parsed by the same rules."""
    from .conf import parse

    conf = parse({"name": network, "stateDir": os.path.abspath(args.state_dir),
                  "cniCacheDir": os.path.abspath(args.cni_cache_dir),
                  "ipamDataDir": os.path.abspath(getattr(args, "ipam_data_dir", DEFAULT_IPAM_DATA_DIR)),
                  "backend": getattr(args, "backend", "auto"), "lockTimeout": getattr(args, "lock_timeout", 10.0),
                  "logFile": getattr(args, "log_file", "") or ""})
    for warning in conf.warnings:
        print(f"{PLUGIN_NAME}: {warning}", file=sys.stderr)
    return conf


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


STATE_WORDS = {"live": "live", "dead": "dead", "tombstone-done": "torn down", "tombstone-expired": "torn down (DEL failed)",
               "tombstone-wait": "torn down (DEL running)"}


def cmd_list(args) -> int:
    from .states import classify
    from .store import Store

    conf = _conf(args)
    if not os.path.isdir(conf.stateDir):
        records = []
    else:
        store = Store(conf.stateDir).open(create=False)
        try:
            records = list(store.records())
        finally:
            store.close()
    items = []
    for r in records:
        cur = r["current"]
        items.append({
            "network": r["network"], "containerID": r["containerID"], "ifname": r["ifname"],
            "ips": [f"{ip['address']}/{ip['prefix']}" for ip in cur["ips"]],
            "ports": [f"{p['hostPort']}->{p['containerPort']}/{p['protocol']}" for p in cur["portMappings"]],
            "netns": cur["netns"], "state": STATE_WORDS[classify(r, conf.cniCacheDir)],
            "earlierIPs": sorted({f"{ip['address']}/{ip['prefix']}" for inc in r["earlier"] for ip in inc["ips"]}),
            "createdAt": cur["createdAt"],
        })
    if args.json:
        print(json.dumps(items, indent=1))
        return EXIT_OK
    if not items:
        print(f"no records in {conf.stateDir}")
    else:
        rows = [("NETWORK", "CONTAINER ID", "IFNAME", "IPS", "PORTS", "NETNS", "STATE")]
        rows += [(i["network"], i["containerID"], i["ifname"], ",".join(i["ips"]) or "-",
                  ",".join(i["ports"]) or "-", i["netns"] or "-", i["state"]) for i in items]
        print(_table(rows))
    print(backends_line(conf.backend))
    return EXIT_OK


def backends_line(backend: str) -> str:
    """Which iptables each family's clean-up uses (each follows its own tool, as the plugins do)."""
    from . import flavour

    parts = []
    for family in (4, 6):
        found, why = flavour.detect(backend, family=family)
        parts.append(f"ipv{family} {found or 'none'} ({why})")
    return "iptables: " + "; ".join(parts)


def _orphans(conf, records, only_network):
    """Tagged attachments with no record whose libcni cache entry names no live netns."""
    from .sweep import cache_entry_alive, orphan_targets

    return orphan_targets(conf, {(r["network"], r["containerID"]) for r in records},
                          lambda network, cid: cache_entry_alive(conf.cniCacheDir, network, cid), only_network)


def cmd_sweep(args) -> int:
    from .store import Store
    from .sweep import sweep

    conf = _conf(args, args.network or "cli")
    log.begin(conf.logFile if args.apply else None, stderr=False, verb="sweep")
    if os.path.isdir(conf.stateDir):
        store = Store(conf.stateDir, conf.lockTimeout).open(create=False)
        try:
            with store.locked():
                records = list(store.records())
                extra = _orphans(conf, records, args.network) if args.orphans else []
                outcome = sweep(store, conf, records=records, extra=extra, dry_run=not args.apply,
                                only_network=args.network)
        finally:
            store.close()
    else:  # no records at all: only orphans can be found
        outcome = sweep(None, conf, extra=_orphans(conf, [], args.network) if args.orphans else [],
                        dry_run=not args.apply)
    groups = {}
    for key, items in outcome.removed.items():
        groups[f"{key[0]} {key[1]}" + (f" {key[2]}" if key[2] else "")] = items
    total = sum(len(v) for v in groups.values())
    errors = outcome.errors
    backends = {f"ipv{f}": name for f, name in sorted(outcome.backends.items())}
    if args.json:
        print(json.dumps({"applied": args.apply, "attachments": groups, "count": total, "errors": errors,
                          "skipped": outcome.skipped, "backends": backends}, indent=1))
    else:
        verb = "removed" if args.apply else "would remove"
        for owner, items in groups.items():
            print(f"{owner}: {verb} {len(items)}")
            for item in items:
                print(f"  - {item}")
        for err in errors:
            print(f"error: {err}", file=sys.stderr)
        print(f"{total} item(s) of {len(groups)} attachment(s) {verb}" +
              ("" if args.apply or not total else "; run again with --apply to remove them"))
        if backends:
            print("backends: " + ", ".join(f"{f} {n}" for f, n in backends.items()))
    if errors:
        return EXIT_LEFT if args.apply else EXIT_ERROR
    if not args.apply and total:
        return EXIT_FOUND
    return EXIT_OK


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return EXIT_USAGE
    if args.command == "version":
        print(f"{PLUGIN_NAME} {__version__}")
        return EXIT_OK
    try:
        return {"list": cmd_list, "sweep": cmd_sweep}[args.command](args)
    except CniError as err:
        print(f"{PLUGIN_NAME}: {err.msg}" + (f" ({err.details})" if err.details else ""), file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - an operator gets one line, never a traceback
        print(f"{PLUGIN_NAME}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
