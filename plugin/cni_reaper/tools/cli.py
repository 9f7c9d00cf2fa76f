"""The operator's command line, in the same binary: used when a person runs it with arguments
(CNI mode, chosen by CNI_COMMAND, stays as it is).

    cni-reaper list [--json]
    cni-reaper sweep [--apply] [--orphans] [--json]
    cni-reaper doctor [--cni-path P] [--json]
    cni-reaper metrics [--textfile DIR]
    cni-reaper journal [CONTAINER_ID] | undo CONTAINER_ID [--dry-run]
    cni-reaper version

This module is the parser and the dispatch; each command is tools/cmd_<command>.py, the networks they work on
tools/context.py.

Every command but version reads the conflists (--cni-conf-dir, default Nomad's /opt/cni/config then
/etc/cni/net.d) and works on each network that chains cni-reaper, with that entry's keys; flags override
them, --network picks one. With no such conflist, the defaults (and flags) are used.

Exit codes: 0 clean (nothing to remove, or everything removed), 1 error, 2 usage,
3 a dry run found something to remove (run again with --apply), 4 --apply left something it could not remove,
5 doctor found a FAIL, 6 something could not be judged: part of the host is hidden from this process (what,
and how to fix it, on stderr); nothing that depends on it was removed.
"""

from __future__ import annotations

import argparse
import sys

from cni_reaper import PLUGIN_NAME, __version__
from cni_reaper.errors import CniError
from cni_reaper.tools import cmd_doctor, cmd_journal, cmd_list, cmd_metrics, cmd_sweep, cmd_undo
from cni_reaper.tools.exits import EXIT_ERROR, EXIT_OK, EXIT_USAGE

DEFAULT_CNI_PATH = cmd_doctor.DEFAULT_CNI_PATH
COMMANDS = {"list": cmd_list.run, "sweep": cmd_sweep.run, "doctor": cmd_doctor.run, "metrics": cmd_metrics.run,
            "journal": cmd_journal.run, "undo": cmd_undo.run}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 2, as documented
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _nomad_flags(p: argparse.ArgumentParser, remove: bool) -> None:
    """The scheduler's word (tools/nomad_word.py, imported only when a command asks for it)."""
    p.add_argument("--nomad", action="store_true", help="also the local Nomad agent's word (NOMAD_ADDR...)")
    p.add_argument("--nomad-token-file", metavar="FILE", help="its ACL token, from FILE")
    if remove:
        p.add_argument("--nomad-remove-netns", action="store_true",
                       help="and the netns of allocations it says are over")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cni-conf-dir", action="append", metavar="DIR",
                   help="where the conflists are (repeatable; default: /opt/cni/config, then /etc/cni/net.d); "
                        "every network whose conflist chains cni-reaper is used with its keys")
    p.add_argument("--network", help="only this network")
    p.add_argument("--config", metavar="FILE",
                   help="the settings file of wrapped networks (default: $CNI_REAPER_CONFIG, else "
                        "/etc/cni-reaper/config.json)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="records (overrides the conflists' stateDir; default /var/lib/cni/reaper)")
    p.add_argument("--cni-cache-dir", metavar="DIR", help="libcni's cache (overrides cniCacheDir; default /var/lib/cni)")
    p.add_argument("--ipam-data-dir", metavar="DIR",
                   help="host-local's dataDir (overrides ipamDataDir; default /var/lib/cni/networks)")
    p.add_argument("--backend", choices=("auto", "nft", "legacy"), help="overrides backend (default auto)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog=PLUGIN_NAME, description="Reap the netfilter rules and IP reservations of dead CNI attachments.",
                  epilog="Exit codes: 0 clean, 1 error, 2 usage, 3 dry run found something, 4 --apply left something, "
                         "5 doctor found a FAIL, 6 something could not be judged (part of the host is hidden from "
                         "this process). As a CNI plugin it is run by the runtime with CNI_COMMAND set.")
    sub = top.add_subparsers(dest="command", metavar="{list,sweep,doctor,metrics,journal,undo,version}",
                             parser_class=_Parser)
    p = sub.add_parser("list", help="every record, and whether it is live, dead or torn down")
    _common(p)
    p = sub.add_parser("sweep", help="show (default) or remove (--apply) what dead attachments left behind")
    _common(p)
    p.add_argument("--apply", action="store_true", help="remove; without it nothing is changed")
    p.add_argument("--orphans", action="store_true",
                   help="also rules tagged for containers with no record and no live netns (in libcni's cache)")
    p.add_argument("--log-file", help="where --apply logs what it removed (overrides logFile; \"\" for none)")
    p.add_argument("--lock-timeout", type=float, metavar="S", help="seconds to wait for the state lock")
    _nomad_flags(p, remove=True)
    p = sub.add_parser("doctor", help="check the conflists and the host; changes nothing")
    _common(p)
    p.add_argument("--cni-path", help=f"where the plugins are, as Nomad's client cni_path (default: the cni_path of "
                                      f"the Nomad client's configuration in /etc/nomad.d, else {DEFAULT_CNI_PATH})")
    p.add_argument("--nomad-config", default="/etc/nomad.d", metavar="DIR", help="the Nomad agent's configuration files")
    _nomad_flags(p, remove=False)
    p.add_argument("--log-file", help="overrides logFile")
    p = sub.add_parser("journal", help="what clean-ups removed (and undo put back), from the journal")
    _common(p)
    p.add_argument("container_id", nargs="?", metavar="CONTAINER_ID", help="only this container's")
    p = sub.add_parser("undo", help="put back what clean-ups removed for a container, unless something live holds it")
    _common(p)
    p.add_argument("container_id", metavar="CONTAINER_ID")
    p.add_argument("--dry-run", action="store_true", help="say what would be put back and what not, change nothing")
    p.add_argument("--log-file", help="where undo logs what it put back (overrides logFile; \"\" for none)")
    p = sub.add_parser("metrics", help="counters of the clean-ups and records by state, in the Prometheus text format")
    _common(p)
    p.add_argument("--textfile", metavar="DIR",
                   help="write DIR/cni_reaper.prom atomically (node_exporter's textfile collector) instead of stdout")
    sub.add_parser("version", help="print the version")
    return top


def main(argv: list[str]) -> int:
    for stream in (sys.stdout, sys.stderr):  # a name no encoding can write (a lone surrogate) is written escaped
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return EXIT_USAGE
    if args.command == "version":
        print(f"{PLUGIN_NAME} {__version__}")
        return EXIT_OK
    try:
        return COMMANDS[args.command](args)
    except CniError as err:
        print(f"{PLUGIN_NAME}: {err.msg}" + (f" ({err.details})" if err.details else ""), file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - an operator gets one line, never a traceback
        print(f"{PLUGIN_NAME}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
