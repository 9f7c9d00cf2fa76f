"""The operator's command line, in the same binary: used when a person runs it with arguments
(CNI mode, chosen by CNI_COMMAND, stays as it is).

    cni-reaper list [--json]
    cni-reaper sweep [--apply] [--orphans] [--json]
    cni-reaper doctor [--cni-path P] [--json]
    cni-reaper metrics [--textfile DIR]
    cni-reaper version

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
import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from cni_reaper.judge.modes import ModeSources
    from cni_reaper.state.record import Record
    from cni_reaper.values import Key

from cni_reaper import PLUGIN_NAME, __version__, log
from cni_reaper.errors import INVALID_CONFIG, CniError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FOUND, EXIT_LEFT, EXIT_DOCTOR, EXIT_BLIND = 0, 1, 2, 3, 4, 5, 6
DEFAULT_CNI_PATH = "/opt/cni/bin:/usr/lib/cni"  # Nomad's client cni_path default, then Debian's plugins


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
    p = sub.add_parser("metrics", help="counters of the clean-ups and records by state, in the Prometheus text format")
    _common(p)
    p.add_argument("--textfile", metavar="DIR",
                   help="write DIR/cni_reaper.prom atomically (node_exporter's textfile collector) instead of stdout")
    sub.add_parser("version", help="print the version")
    return top


class Context:
    """One network as the CLI works on it: its configuration (conflist keys, then flags) and where it came
    from. `network` None: no conflist was found, so every network of the state directory, with the defaults."""

    def __init__(self, conf, network: str | None, source: str | None, keeping=None) -> None:
        self.conf, self.network, self.source = conf, network, source
        # where its conflist says host-local keeps it (no data dir: not known); None: a network cni-reaper wraps
        # (Nomad's own bridge, always host-local's): where its records saw it
        self.keeping = keeping


def _overrides(args) -> dict:
    out = {}
    for flag, key in (("state_dir", "stateDir"), ("cni_cache_dir", "cniCacheDir"), ("ipam_data_dir", "ipamDataDir"),
                      ("log_file", "logFile")):
        value = getattr(args, flag, None)
        if value is not None:
            out[key] = os.path.abspath(value) if value else value
    if getattr(args, "backend", None):
        out["backend"] = args.backend
    if getattr(args, "lock_timeout", None) is not None:
        out["lockTimeout"] = args.lock_timeout
    return out


def _scan(args):
    from cni_reaper.tools.conflists import DEFAULT_DIRS, scan

    dirs = [os.path.abspath(d) for d in (args.cni_conf_dir or DEFAULT_DIRS)]
    return dirs, scan(dirs)


def _settings(args):
    """The settings file of wrapped networks (--config, else CNI_REAPER_CONFIG, else /etc/cni-reaper/config.json)."""
    from cni_reaper.cni.settings_file import load

    env = dict(os.environ)
    if getattr(args, "config", None):
        env["CNI_REAPER_CONFIG"] = os.path.abspath(args.config)
        if not os.path.exists(env["CNI_REAPER_CONFIG"]):  # named, so meant: a typo must not drop its "mode"
            raise CniError(INVALID_CONFIG, f"--config {args.config}: no such file",
                           "name the settings file of the wrapped networks, or leave --config out")
    s = load(env)
    if s.problem:
        print(f"{PLUGIN_NAME}: {s.problem}", file=sys.stderr)
    return s


def _context(raw: dict, name: str | None, source: str | None, keeping=None) -> tuple[Context | None, bool]:
    from cni_reaper.cni.conf import parse

    try:
        conf = parse(raw)
    except CniError as err:
        print(f"{PLUGIN_NAME}: {source or 'flags'}: {err.msg} ({err.details}); network {name} skipped", file=sys.stderr)
        return None, True
    for warning in conf.warnings:
        print(f"{PLUGIN_NAME}: {source or 'flags'}: {warning}", file=sys.stderr)
    return Context(conf, name, source, keeping), False


def _contexts(args, found=None) -> tuple[list[Context], bool]:
    """The networks to work on: every network whose conflist (in --cni-conf-dir) chains cni-reaper, the
    first file of each name, and every network the settings file of wrapped networks names, or only
    --network; with none, the settings file's keys, the flags and the defaults. Returns (contexts, whether a
    network that could not be used was left out)."""
    dirs, found = found if found is not None else _scan(args)
    overrides = _overrides(args)
    settings = _settings(args)
    contexts, skipped = [], False
    runs = _runs(args, found, overrides, settings)
    for raw, name, source, reserved in runs:
        c, bad = _context(raw, name, source, reserved)
        skipped |= bad
        if c is not None:
            contexts.append(c)
    if not runs:
        if not found.networks and not args.json:
            print(f"{PLUGIN_NAME}: no conflist in {', '.join(dirs)} chains cni-reaper; using the defaults and flags"
                  + (f" and {settings.path}" if settings.keys else ""), file=sys.stderr)
        c, bad = _context({"name": args.network or "cli", **settings.keys, **overrides}, args.network, None)
        skipped |= bad
        if c is not None:
            contexts.append(c)
    return contexts, skipped


def _runs(args, found, overrides: dict, settings) -> list:
    """(the raw configuration, network, where it came from, host-local's keeping) of each network to work on:
    the conflists' that chain cni-reaper (the first file of each name), then the settings file's others."""
    networks = [n for n in found.networks if n.shadowed_by is None and (not args.network or n.name == args.network)]
    runs = [({**n.raw_conf(), **overrides}, n.name, n.path, n.keeping()) for n in networks]
    named = {n.name for n in networks}
    runs += [({"name": n, **settings.for_network(n), **overrides}, n, settings.path, None) for n in sorted(settings.networks)
             if n not in named and (not args.network or n == args.network)]
    return runs


def _by_state_dir(contexts: list[Context]) -> dict[str, list[Context]]:
    """Networks that share a state directory are read (and locked) together: each attachment once."""
    groups: dict[str, list[Context]] = {}
    for c in contexts:
        groups.setdefault(c.conf.stateDir, []).append(c)
    return groups


def _records(state_dir: str) -> list[Record]:
    from cni_reaper.state.store import Store

    if not os.path.isdir(state_dir):
        return []
    store = Store(state_dir).open(create=False, read_only=True)
    try:
        return list(store.records())
    finally:
        store.close()


def _states(records: list[Record], group: list[Context], view) -> dict[Key, tuple[str, str]]:
    """Each record's state and why, judged as every pass judges it (with its own settings)."""
    from cni_reaper.reap.engine import judged

    confs = {c.network: c.conf for c in group if c.network}
    return {k: (v.state, v.why) for k, v in judged(records, view, confs, group[0].conf.cniCacheDir).items()}


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


STATE_WORDS = {"live": "live", "dead": "dead", "unknown": "unknown", "left": "dead (left for the runtime's DEL or GC)",
               "held": "dead (held by something not ours)",
               "tombstone-done": "torn down",
               "tombstone-expired": "torn down (DEL failed)", "tombstone-wait": "torn down (DEL running)"}


def cmd_list(args) -> int:
    from cni_reaper.reap.engine import View

    contexts, skipped = _contexts(args)
    items = []
    view = View()
    for state_dir, group in _by_state_dir(contexts).items():
        records = [r for r in _records(state_dir) if not args.network or r.network == args.network]
        states = _states(records, group, view)
        items += [_listed(r, *states[r.key], state_dir) for r in records]
    if args.json:
        print(json.dumps(items, indent=1))
        return EXIT_ERROR if skipped else EXIT_OK
    if not items:
        print(f"no records in {', '.join(_by_state_dir(contexts))}")
    else:
        _print_list(items)
    print(backends_line(contexts[0].conf.backend))
    return EXIT_ERROR if skipped else EXIT_OK


def _listed(r: Record, state: str, why: str, state_dir: str) -> dict:
    """`list`'s item of one record (its JSON form)."""
    cur = r.current
    return {
        "network": r.network, "containerID": r.container_id, "ifname": r.ifname,
        "ips": [ip.cidr for ip in cur.ips], "ports": [p.text for p in cur.ports],
        "netns": cur.netns, "state": STATE_WORDS[state], "why": why,
        "earlierIPs": sorted({ip.cidr for life in r.earlier for ip in life.ips}),
        "createdAt": cur.created_at, "stateDir": state_dir,
    }


def _print_list(items: list[dict]) -> None:
    rows = [("NETWORK", "CONTAINER ID", "IFNAME", "IPS", "PORTS", "NETNS", "STATE")]
    rows += [(i["network"], i["containerID"], i["ifname"], ",".join(i["ips"]) or "-",
              ",".join(i["ports"]) or "-", i["netns"] or "-", i["state"]) for i in items]
    print(_table(rows))
    for i in items:
        if i["state"] == "unknown":
            print(f"{i['containerID']}: cannot be judged: {i['why']}", file=sys.stderr)
        elif i["state"] == STATE_WORDS["held"]:
            print(f"{i['containerID']}: {i['why']}", file=sys.stderr)


def backends_line(backend: str) -> str:
    """Which iptables each family's clean-up uses (each follows its own tool, as the plugins do)."""
    from cni_reaper.reap.netfilter import flavour

    parts = []
    for family in (4, 6):
        found, why = flavour.detect(backend, family=family)
        parts.append(f"ipv{family} {found or 'none'} ({why})")
    return "iptables: " + "; ".join(parts)


def _glance(first: Context) -> list[Record]:
    """The records of a state directory as they are now, read without its lock (who to ask Nomad about)."""
    from cni_reaper.state.store import Store

    if not os.path.isdir(first.conf.stateDir):
        return []
    try:
        store = Store(first.conf.stateDir, first.conf.lockTimeout).open(create=False, read_only=True)
    except (CniError, OSError):
        return []  # the sweep under the lock says what is wrong with it
    try:
        return list(store.records())
    except (CniError, OSError):
        return []
    finally:
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


def _sweep_group(args, group: list[Context], total, view, word=None) -> None:
    """Sweep the networks of one state directory under its lock: each record with its own settings (a record
    of cni-reaper 0.2 with its network's conflist, or the first one's when no conflist names its network any
    more); tagged attachments without a record where libcni's cache proves them dead, or host-local (where the
    network's records, or else its conflist, say host-local keeps it: orphans.proven_dead)."""
    from cni_reaper.reap.engine import operator_pass
    from cni_reaper.state.store import Store
    from cni_reaper.tools import nomad_word

    first = group[0]
    store = None
    if os.path.isdir(first.conf.stateDir):
        # a dry run (and doctor's look at the leaks) reads only: a mode other than 0700 is left as it is
        store = Store(first.conf.stateDir, first.conf.lockTimeout).open(create=False, read_only=not args.apply)
    try:
        lock = store.locked() if store is not None else _NoLock()
        with lock:
            records = list(store.records()) if store is not None else []
            runs = _sweep_runs(args, group, records)
            confs = {n: conf for conf, n in runs if n}
            modes = _modes(store, group, _settings(args))
            said = nomad_word.verdicts(word, records, view, args.apply, args, modes, store)
            for conf, network in runs:
                extra = _orphans(group, records, conf, network, view) if args.orphans else None
                outcome = operator_pass(store, conf, records, view, confs, modes, not args.apply, network, said.verdicts,
                                        extra)
                if args.apply and store is not None:
                    said.count(store, outcome.removed)
                total.merge(outcome)
    finally:
        if store is not None:
            store.close()


def _orphans(group: list[Context], records: list[Record], conf, network: str | None, view) -> list:
    """The tagged attachments of `network` with no record that libcni's cache or host-local proves dead;
    host-local's directory of the network is where its records saw it, else where its conflist says."""
    from cni_reaper.reap import orphans
    from cni_reaper.reap.hostlocal import Keeping
    from cni_reaper.state.record import ips, network_dir

    recorded: dict[tuple[str, str], set[str]] = {}
    for r in records:
        recorded.setdefault((r.network, r.container_id), set()).update(ips(*r.lives))
    if not network:
        return orphans.proven_dead(conf, recorded, view, network)
    keeping = next((c.keeping for c in group if c.network == network), Keeping())
    seen = network_dir(records, network)
    if keeping is None:  # wrapped: Nomad's bridge network, whose IPAM is host-local, where its records saw it
        keeping = Keeping(seen, {ip.cidr for r in records if r.network == network for life in r.lives for ip in life.ips})
    elif seen and seen != keeping.data_dir:  # the records saw host-local elsewhere than the conflist says it is now
        view.note(f"host-local's directory of {network} is {keeping.data_dir or 'not host-local'} in its conflist, "
                  f"{seen} in its records: its reservations prove nothing")
        keeping = Keeping()
    return orphans.proven_dead(conf, recorded, view, network, keeping)


def _modes(store, group: list[Context], settings) -> ModeSources:
    """Every source of the modes of this sweep (judge/modes): the state directory's (the networks' own calls),
    the conflists read here (those that chain cni-reaper: not the settings file's networks), the settings file
    of wrapped networks, and with no conflist at all the settings' own mode for every network. The CLI writes
    none: its view (its conflists, its settings file) may not be the runtime's, and only ever raises a mode for
    its own sweep."""
    from cni_reaper.state import modes

    known = modes.modes(store) if store is not None else {}
    wrapped = modes.wrapped_networks(store) if store is not None else set()
    conflists = {c.network: c.conf.mode for c in group if c.network and c.keeping is not None}
    bare = any(c.network is None and c.conf.mode == "observe" for c in group)  # no conflist: the settings say observe
    return modes.sources(known, wrapped, settings, conflists=conflists, forced="observe" if bare else None)


class _NoLock:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        return None


def cmd_sweep(args) -> int:
    from cni_reaper.reap.engine import View
    from cni_reaper.reap.outcome import Outcome

    contexts, skipped = _contexts(args)
    log.begin(contexts[0].conf.logFile if args.apply else None, stderr=False, verb="sweep")
    total = Outcome()
    view = View(at_once=True)  # what something not ours held is looked at now, not at its retry time
    from cni_reaper.tools import nomad_word

    by_dir = list(_by_state_dir(contexts).values())
    # asked before any state lock is taken: no ADD waits on Nomad's API
    word = nomad_word.ask(args, lambda: [r for g in by_dir for r in _glance(g[0])], view)  # and /proc, if need be
    for group in by_dir:
        if args.apply:
            log.begin(group[0].conf.logFile, stderr=False, verb="sweep")
        _sweep_group(args, group, total, view, word)
    total.unknown = dict(view.blind)
    groups = {}
    for key, items in total.removed.items():
        groups[f"{key.network} {key.container_id}" + (f" {key.ifname}" if key.ifname else "")] = items
    count = sum(len(v) for v in groups.values())
    backends = {f"ipv{f}": name for f, name in sorted(total.backends.items())}
    if args.json:
        print(json.dumps({"applied": args.apply, "attachments": groups, "count": count, "errors": total.errors,
                          "skipped": total.skipped, "unknown": total.unknown, "backends": backends,
                          "held": {" ".join(k).strip(): why for k, why in total.held.items()},
                          "observed": {" ".join(k): v for k, v in total.would.items()},
                          "networks": [c.network for c in contexts if c.network]}, indent=1))
    else:
        _print_sweep(args, groups, count, total, backends)
    return _sweep_exit(args.apply, total, count, skipped)


def _sweep_exit(applied: bool, total, count: int, skipped: bool) -> int:
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


def _print_sweep(args, groups: dict, count: int, total, backends: dict) -> None:
    verb = "removed" if args.apply else "would remove"
    for owner, items in groups.items():
        print(f"{owner}: {verb} {len(items)}")
        for item in items:
            print(f"  - {item}")
    for owner, items in total.would.items():
        print(f"{' '.join(owner).strip()}: would remove {len(items)} (its network is in observe mode: nothing removed)")
        for item in items:
            print(f"  - {item}")
    for err in total.errors:
        print(f"error: {err}", file=sys.stderr)
    for why in total.skipped:
        print(f"left on purpose: {why}", file=sys.stderr)
    for owner, why in total.held.items():
        print(f"{' '.join(owner).strip()}: left in place, something not ours holds it: {why} (its record is kept; "
              "remove what holds it, then sweep again)", file=sys.stderr)
    for why, n in sorted(total.unknown.items()):
        print(f"cannot judge {n} attachment(s): {why}; nothing that depends on it was removed "
              "(run where the runtime runs: the host's mount and network namespaces, /proc mounted)", file=sys.stderr)
    print(f"{count} item(s) of {len(groups)} attachment(s) {verb}" +
          ("" if args.apply or not count else "; run again with --apply to remove them"))
    if backends:
        print("backends: " + ", ".join(f"{f} {n}" for f, n in backends.items()))


def cmd_metrics(args) -> int:
    from cni_reaper.judge.verdict import DEAD, EXPIRED, HELD, LEFT, LIVE, UNKNOWN
    from cni_reaper.reap.engine import View
    from cni_reaper.state.counters import load as load_counters
    from cni_reaper.state.store import Store
    from cni_reaper.tools import metrics

    contexts, skipped = _contexts(args)
    counters: list[dict] = []
    records: dict[tuple[str, str], int] = {}
    word = {LIVE: "live", DEAD: "dead", EXPIRED: "dead", UNKNOWN: "unknown", LEFT: "left", HELD: "held"}
    view = View()
    for state_dir, group in _by_state_dir(contexts).items():
        if not os.path.isdir(state_dir):
            continue
        store = Store(state_dir).open(create=False, read_only=True)
        try:
            counters.append(load_counters(store))
            found = list(store.records())
        finally:
            store.close()
        states = _states(found, group, view)
        for r in found:
            which = (r.network, word.get(states[r.key][0], "torn_down"))
            records[which] = records.get(which, 0) + 1
    merged = metrics.merge(counters)
    if args.network:
        for part in ("attachments", "removed", "failures"):
            merged[part] = {n: v for n, v in merged[part].items() if n == args.network}
        records = {k: v for k, v in records.items() if k[0] == args.network}  # (network, state)
    text = metrics.exposition(merged, records, [c.network for c in contexts if c.network])
    if args.textfile:
        try:
            written = metrics.write_textfile(args.textfile, text)
        except OSError as exc:
            print(f"{PLUGIN_NAME}: cannot write {args.textfile}/cni_reaper.prom: {exc.strerror}", file=sys.stderr)
            return EXIT_ERROR
        print(f"{PLUGIN_NAME}: wrote {written}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_ERROR if skipped else EXIT_OK


def cmd_doctor(args) -> int:
    from cni_reaper.tools import doctor, nomad_word

    dirs, found = _scan(args)
    contexts, skipped = _contexts(args, (dirs, found))
    nomad = doctor.nomad_cni_path(args.nomad_config)
    cni_path = [d for d in args.cni_path.split(":") if d] if args.cni_path else (
        nomad[0] if nomad else DEFAULT_CNI_PATH.split(":"))
    wrap = doctor.check_wrap(cni_path, nomad)
    findings = doctor.check_scan(found, dirs, wrapped=bool(wrap)) + wrap
    findings += _doctor_networks(args, found, contexts, cni_path)
    findings += _doctor_records(contexts)
    findings += _doctor_leaks(args, contexts)
    findings += doctor.check_iptables(contexts[0].conf.backend)
    findings.append(doctor.check_nftables())
    findings += nomad_word.doctor_findings(args)
    failed = any(f.status == doctor.FAIL for f in findings) or skipped
    if args.json:
        print(json.dumps({"ok": not failed, "findings": [f.as_dict() for f in findings]}, indent=1))
    else:
        for f in findings:
            print(f.line())
        print(doctor.summary(findings))
    return EXIT_DOCTOR if failed else EXIT_OK


def _doctor_networks(args, found, contexts: list[Context], cni_path: list[str]) -> list:
    """doctor's findings of each network: its conflist (shadowed by another file of its name, the chain's
    order and capabilities, host-local's directory, the plugins), its state directory, log file and mode."""
    from cni_reaper.tools import doctor

    findings = []
    by_name = {n.name: n for n in found.networks if n.shadowed_by is None}
    for n in found.networks:
        if n.shadowed_by is not None and (not args.network or n.name == args.network):
            findings.append(doctor.check_shadowed(n))
    for c in contexts:
        n = by_name.get(c.network or "")
        if n is None:
            continue
        findings += [doctor.check_order(n), doctor.check_capability(n), doctor.check_ipam_dir(n, c.conf)]
        findings += doctor.check_plugins(n, cni_path)
        findings += doctor.check_own_files(n.name, c.conf)
    for c in contexts:
        if c.network not in by_name:  # a wrapped network (its settings file), or none: the flags and defaults
            findings += doctor.check_own_files(c.network or "(defaults)", c.conf)
        findings.append(doctor.check_mode(c.network or "(defaults)", c.conf.mode, c.source))
    return findings


def cmd_journal(args) -> int:
    from cni_reaper.state import journal
    from cni_reaper.state.store import Store

    contexts, skipped = _contexts(args)
    rows = []
    for state_dir in _by_state_dir(contexts):
        if not os.path.isdir(state_dir):
            continue
        store = Store(state_dir).open(create=False, read_only=True)
        try:
            for e in journal.items(store, args.container_id):
                rows.append({"at": e.at, "verb": e.verb, "key": e.item["key"], "kind": e.item.get("kind"),
                             "what": _what(e.item), "removed": "yes" if e.sure else "perhaps (no done)",
                             "undone": e.restored, "stateDir": state_dir, "item": e.item})
        finally:
            store.close()
    if args.json:
        print(json.dumps(rows, indent=1))
    elif not rows:
        print("the journal has nothing" + (f" of {args.container_id}" if args.container_id else ""))
    else:
        import time

        for r in rows:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r["at"]))
            state = " (undone)" if r["undone"] else ("" if r["removed"] == "yes" else " (perhaps: the clean-up was cut)")
            print(f"{at} {r['verb'] or '-':6} {' '.join(r['key']).strip()}: {r['what']}{state}")
    return EXIT_ERROR if skipped else EXIT_OK


def _what(item: dict) -> str:
    kind = item.get("kind")
    if kind == "iptables":
        return f"ipv{item['family']} {item['flavour']} {item['table']} {item['chain']}: {item.get('what', '')}"
    if kind == "nft":
        return f"nft {item['family']} {item['table']} {item['chain']}: {item.get('what', '')}"
    if kind == "reservation":
        return f"host-local reservation {item['network']}/{item['ip']} ({item['dataDir']})"
    if kind == "cache":
        return f"libcni's cached result {item['entry']} (its addresses forgotten)"
    if kind == "conntrack":
        return f"conntrack: {item['entries']} entries of {item['ip']} cleared (cannot be put back)"
    if kind == "netns":
        return f"network namespace {item['netns']} removed on Nomad's word (cannot be put back)"
    return "the record" if kind == "record" else str(kind)


def cmd_undo(args) -> int:
    from cni_reaper.state.store import Store
    from cni_reaper.tools import undo

    contexts, skipped = _contexts(args)
    log.begin(contexts[0].conf.logFile if not args.dry_run else None, stderr=False, verb="undo")
    restored, refused, lost = [], [], []
    for state_dir, group in _by_state_dir(contexts).items():
        if not os.path.isdir(state_dir):
            continue
        store = Store(state_dir, group[0].conf.lockTimeout).open(create=False)
        try:
            with store.locked():
                report = undo.undo(store, args.container_id, args.dry_run, [c.conf.ipamDataDir for c in group],
                                   {c.network: c.conf for c in group if c.network}, group[0].conf.cniCacheDir)
        finally:
            store.close()
        restored += [(e.item, what) for e, what in report.restored]
        refused += [(e.item, why) for e, why in report.refused]
        lost += [e.item for e in report.unrestorable] + [e.item for e, _ in report.gone]
    for item, _ in restored:
        log.info("put back" if not args.dry_run else "would put back", containerID=args.container_id, item=_what(item))
    return _print_undo(args, restored, refused, lost, skipped)


def _print_undo(args, restored: list, refused: list, lost: list, skipped: bool) -> int:
    if args.json:
        print(json.dumps({"dryRun": args.dry_run, "restored": [_what(i) for i, _ in restored],
                          "refused": [{"item": _what(i), "why": why} for i, why in refused],
                          "cannotRestore": [_what(i) for i in lost]}, indent=1))
    else:
        verb = "would put back" if args.dry_run else "put back"
        for item, what in restored:
            print(f"{verb}: {_what(item)}" + (f" ({what})" if what in ("already there", "already back") else ""))
        for item, why in refused:
            print(f"not put back: {_what(item)}: {why}")
        for item in lost:
            print(f"cannot be put back: {_what(item)}")
        if not (restored or refused or lost):
            print(f"nothing of {args.container_id} to put back (the journal has nothing, or it was undone)")
    if refused or skipped:
        return EXIT_LEFT
    return EXIT_OK


def _doctor_leaks(args, contexts: list[Context]) -> list:
    """What the client leaks now, as `sweep --orphans` (a dry run, the same judgement) finds it, and the host
    ports more than one container maps (a dead allocation's DNAT shadowing a live one's, or a conflict)."""
    from argparse import Namespace

    from cni_reaper.reap.engine import View
    from cni_reaper.reap.holders import port_map
    from cni_reaper.reap.outcome import Outcome
    from cni_reaper.tools import doctor

    total, view = Outcome(), View(at_once=True)
    dry = Namespace(**{**vars(args), "orphans": True, "apply": False})
    try:
        for group in _by_state_dir(contexts).values():
            _sweep_group(dry, group, total, view)
        doubled = port_map().doubled()
    except Exception as exc:  # noqa: BLE001 - doctor reports, it does not fail on what it cannot look at
        return [doctor.Finding(doctor.WARN, "leaks", "", f"what this client leaks could not be looked at ({exc})")]
    found = {**total.removed, **total.would}
    items = sum(len(v) for v in found.values())
    reserved = sum(1 for v in found.values() for item in v if item.startswith("host-local reservation"))
    unknown = sum(view.blind.values())
    said = (f"; {unknown} attachment(s) could not be judged (`cni-reaper sweep --orphans` says why)" if unknown else "")
    ports = "; ".join(f"{port} by {', '.join(sorted(owners))}" for port, owners in sorted(doubled.items()))
    if not found and not doubled:
        return [doctor.Finding(doctor.OK, "leaks", "", "no dead attachment's rules or reservations are left, and no "
                               f"host port is mapped twice{said}")]
    parts = [f"{len(found)} dead attachment(s) left {items} item(s), {reserved} of them reservation(s)"] if found else []
    parts += [f"host ports mapped by more than one container: {ports}"] if doubled else []
    msg = "; ".join(parts) + said
    return [doctor.Finding(doctor.WARN, "leaks", "", msg, "`cni-reaper sweep --orphans` lists them with the evidence; "
                           "`cni-reaper sweep --orphans --apply` removes what is proven dead")]


def _doctor_records(contexts: list[Context]) -> list:
    """doctor's checks of the records: dead ones waiting, and what cannot be judged from here, and why."""
    from cni_reaper.reap.engine import View
    from cni_reaper.tools import doctor

    out = []
    view = View()
    recorded = 0
    for state_dir, group in _by_state_dir(contexts).items():
        try:
            records = _records(state_dir)
        except CniError:
            continue  # a state directory that cannot be used: the state-dir check says why
        recorded += len(records)
        states = list(_states(records, group, view).values())
        out.append(doctor.check_records(state_dir, [c.network or "(defaults)" for c in group], states))
        out += doctor.check_sharing(state_dir, [c for c in group if c.network], records)
    out += doctor.check_view(view, [c.conf for c in contexts], recorded)
    return out


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return EXIT_USAGE
    if args.command == "version":
        print(f"{PLUGIN_NAME} {__version__}")
        return EXIT_OK
    try:
        return {"list": cmd_list, "sweep": cmd_sweep, "doctor": cmd_doctor, "metrics": cmd_metrics,
                "journal": cmd_journal, "undo": cmd_undo}[args.command](args)
    except CniError as err:
        print(f"{PLUGIN_NAME}: {err.msg}" + (f" ({err.details})" if err.details else ""), file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - an operator gets one line, never a traceback
        print(f"{PLUGIN_NAME}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
