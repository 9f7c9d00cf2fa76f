"""The networks a command works on (tools/cli.py): every network whose conflist chains cni-reaper, the
networks of the settings file of wrapped networks, or the flags and defaults; their records, read as every pass
reads them, and the sources of their modes."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.judge.modes import ModeSources
    from cni_reaper.state.record import Record
    from cni_reaper.values import Key

from cni_reaper import PLUGIN_NAME
from cni_reaper.errors import INVALID_CONFIG, CniError


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


def scan_dirs(args):
    from cni_reaper.tools.conflists import DEFAULT_DIRS, scan

    dirs = [os.path.abspath(d) for d in (args.cni_conf_dir or DEFAULT_DIRS)]
    return dirs, scan(dirs)


def settings_path(args) -> str:
    """The settings file of wrapped networks: --config, else CNI_REAPER_CONFIG, else /etc/cni-reaper/config.json."""
    from cni_reaper.cni.settings_file import path_of

    if getattr(args, "config", None):
        path = os.path.abspath(args.config)
        if not os.path.exists(path):  # named, so meant: a typo must not drop its "mode"
            raise CniError(INVALID_CONFIG, f"--config {args.config}: no such file",
                           "name the settings file of the wrapped networks, or leave --config out")
        return path
    return path_of(os.environ)


def settings_of(args):
    """The settings file of wrapped networks, read as a wrapped call reads it (settings_path)."""
    from cni_reaper.cni.settings_file import load

    s = load({**os.environ, "CNI_REAPER_CONFIG": settings_path(args)})
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


def contexts(args, found=None) -> tuple[list[Context], bool]:
    """The networks to work on: every network whose conflist (in --cni-conf-dir) chains cni-reaper, the
    first file of each name, and every network the settings file of wrapped networks names, or only
    --network; with none, the settings file's keys, the flags and the defaults. Returns (contexts, whether a
    network that could not be used was left out)."""
    dirs, found = found if found is not None else scan_dirs(args)
    overrides = _overrides(args)
    settings = settings_of(args)
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


def by_state_dir(contexts: list[Context]) -> dict[str, list[Context]]:
    """Networks that share a state directory are read (and locked) together: each attachment once."""
    groups: dict[str, list[Context]] = {}
    for c in contexts:
        groups.setdefault(c.conf.stateDir, []).append(c)
    return groups


def records_in(state_dir: str) -> list[Record]:
    from cni_reaper.state.store import Store

    if not os.path.isdir(state_dir):
        return []
    store = Store(state_dir).open(create=False, read_only=True)
    try:
        return list(store.records())
    finally:
        store.close()


def states(records: list[Record], group: list[Context], view) -> dict[Key, tuple[str, str]]:
    """Each record's state and why, judged as every pass judges it (with its own settings)."""
    from cni_reaper.reap.engine import judged

    confs = {c.network: c.conf for c in group if c.network}
    return {k: (v.state, v.why) for k, v in judged(records, view, confs, group[0].conf.cniCacheDir).items()}


def glance(first: Context) -> list[Record]:
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


def modes_of(store, group: list[Context], settings) -> ModeSources:
    """Every source of the modes of this sweep (judge/modes): the state directory's (the networks' own calls),
    the conflists read here (those that chain cni-reaper: not the settings file's networks), the settings file
    of wrapped networks, and with no conflist at all the settings' own mode for every network. The CLI writes
    none: its view (its conflists, its settings file) may not be the runtime's, and only ever raises a mode for
    its own sweep."""
    from cni_reaper.state import modes

    known = modes.modes(store) if store is not None else {}
    wrapped = modes.wrapped_networks(store) if store is not None else {}
    conflists = {c.network: c.conf.mode for c in group if c.network and c.keeping is not None}
    # no conflist: the CLI runs with the settings file's keys, so a file that says observe, or that cannot be used
    # (what cannot be read says observe), makes the whole run observe
    bare = any(c.network is None and (c.conf.mode == "observe" or getattr(settings, "problem", None)) for c in group)
    return modes.sources(known, wrapped, settings, conflists=conflists, forced="observe" if bare else None,
                         recorded=modes.recorded_networks(store))


class NoLock:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        return None
