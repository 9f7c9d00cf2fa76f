"""Two small files of the state directory's own, read and written under its lock:

- `.modes`: each network's mode (clean or observe) as its own calls last said it, so that a sweep run by
  another network's call, or by the CLI, treats that network's dead attachments as their network says:
  observed, not removed. Read by every call's sweep (stale or not), written only when a network's mode is
  first said or changes, durably. A network that has records and no mode here (the file lost or removed) is
  observed until its own call says its mode again (judge/modes): others' sweeps never decide it.
- `.wrapped`: the networks a wrapper (wrap mode) has served, each with the mode its wrapper's calls last said
  (from the settings file); the settings file's top-level mode governs them (judge/modes).
- `.booted`: for each network, the boot in which an ADD of it last looked at libcni's cached attachments that
  have no record (verbs/add.py: once per boot, the first ADD does).
- `.observed`: for each attachment that observe mode would clean, a digest of what it would remove, so that
  its "would remove" log line and counters come once per attachment and change, not once per call.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.judge.modes import ModeSources
    from cni_reaper.state.store import Store

from cni_reaper import jsonio

MODES = ".modes"
OBSERVED = ".observed"
MAX_BYTES = 4 << 20




def _load(store: Store, name: str) -> dict[str, str] | None:
    """The file's string pairs ({} when there is none); None when it is there and cannot be read as one."""
    data, why = store.dir.read(name, MAX_BYTES)
    if data is None:
        return None if why else {}
    try:
        doc = jsonio.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return {k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(doc, dict) else None


def modes(store: Store) -> dict[str, str] | None:
    """Each network's mode as its own calls said it. A file that is there but cannot be read says nothing of
    who is observed (None): every network is then observed (`sources`: judge/modes.EVERY), and the file is not
    written over (it would lose them)."""
    known = _load(store, MODES)
    if known is None:
        from cni_reaper import log

        log.warn("the modes file cannot be read: every network is observed, nothing is removed",
                 fix=f"remove {store.dir.root}/{MODES}; each network's next call says its mode again")
    return known


def remember_mode(store: Store, known: dict[str, str] | None, network: str, mode: str) -> None:
    """Note a network's mode when the file does not say it yet, or says another (the caller holds the lock;
    nothing is noted over a file that cannot be read)."""
    if known is None or known.get(network) == mode:
        return
    known[network] = mode
    try:
        store.dir.write(MODES, jsonio.dumps(known).encode(), durable=True)
    except OSError:
        pass


def observed(store: Store) -> dict[str, str]:
    return _load(store, OBSERVED) or {}


def save_observed(store: Store, seen: dict[str, str]) -> None:
    try:
        store.dir.write(OBSERVED, jsonio.dumps(seen).encode())
    except OSError:
        pass


# -- the one resolution of each network's mode --------------------------------------------------------------
WRAPPED = ".wrapped"


def network_modes(store: Store, conf: Any) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    """Each network's mode as its own conflist's calls said it (`.modes`), and the mode of each network a
    wrapper has served as the wrapper's calls said it (`.wrapped`), this call's noted in the one that is its:
    every call says its mode, stale or not, so that others' sweeps read it. A network chained in a conflist
    whose portmap is wrapped too is in both; neither call writes over the other's word (observe from either
    wins). Either file that cannot be read is None: every network is observed (`sources`), and it is not
    written over (it would lose what it says). 0.5.0 wrote "wrapped" for each network of `.wrapped` and noted
    a wrapper's mode in `.modes`: that word stays (a later call cannot tell it from a conflist's)."""
    known = modes(store)
    wrapped = wrapped_networks(store)
    if getattr(conf, "wrapped_by", None) is None:
        remember_mode(store, known, conf.name, conf.mode)
    elif wrapped is not None and wrapped.get(conf.name) != conf.mode:
        wrapped[conf.name] = conf.mode
        try:
            store.dir.write(WRAPPED, jsonio.dumps(dict(sorted(wrapped.items()))).encode(), durable=True)
        except OSError:
            pass
    return known, wrapped


def wrapped_networks(store: Store) -> dict[str, str] | None:
    """network -> the mode its wrapper's calls last said ("wrapped": noted by 0.5.0, which said none); None
    when the file is there and cannot be read (every network is then observed)."""
    wrapped = _load(store, WRAPPED)
    if wrapped is None:
        from cni_reaper import log

        log.warn("the wrapped networks' file cannot be read: every network is observed, nothing is removed",
                 fix=f"remove {store.dir.root}/{WRAPPED}; each wrapped network's next call says its mode again")
    return wrapped


def verb_sources(noted: tuple[dict[str, str] | None, dict[str, str] | None], conf: Any, store: Store) -> ModeSources:
    """The modes of a verb's pass: the state directory's word (network_modes) and records, the settings file's,
    and this call's network's mode for what it finds of networks that never chained cni-reaper."""
    return sources(*noted, file_of(conf), finder=conf.mode, recorded=recorded_networks(store))


def observing(store: Store, conf: Any, network: str) -> bool:
    """Whether a verb's pass would observe `network` (read only: nothing noted)."""
    return verb_sources((modes(store), wrapped_networks(store)), conf, store).observing(network)


def recorded_networks(store: Store | None) -> frozenset[str]:
    """The networks that have records in the state directory (the index's word, read under the state lock;
    none known without it)."""
    return frozenset(store.attached().networks) if store is not None and store.index is not None else frozenset()


def sources(known: dict[str, str] | None, wrapped: dict[str, str] | None, file: Any, finder: str | None = None,
            conflists: dict[str, str] | None = None, forced: str | None = None,
            recorded: frozenset[str] = frozenset()) -> ModeSources:
    """Every source of a pass's modes (judge/modes.ModeSources): the state directory's word (`known`, `wrapped`:
    network_modes) and the networks it has records of (`recorded`), the settings file of wrapped networks (`file`,
    cni.settings_file.SettingsFile, or None: its top level and its networks; a file that cannot be used says
    observe), and the caller's: the mode of the call that found the targets (`finder`), the conflists the CLI
    reads (`conflists`), a mode forced for the pass."""
    from cni_reaper.cni.conf import mode_of
    from cni_reaper.judge.modes import EVERY, ModeSources

    if known is None or wrapped is None:  # a file of modes that cannot be read: every network observed
        known = {**(known or {}), EVERY: "observe"}
    top, per = None, {}
    if file is not None:
        top = "observe" if file.problem else mode_of(file.keys, [])
        per = {n: "observe" if file.problem else mode_of(file.for_network(n), []) for n in file.networks}
    return ModeSources(known, wrapped or {}, top, per, conflists, finder, forced, recorded)


def file_of(conf: Any) -> Any:
    """The settings file of wrapped networks as this process sees it: the wrapper's own, else the file at
    CNI_REAPER_CONFIG or the default path when there is one (read only when a sweep has something to do)."""
    import os

    if getattr(conf, "wrapped_by", None) is not None:
        return conf.wrapped_by
    from cni_reaper.cni import settings_file as settings

    return settings.load(os.environ) if settings.exists(os.environ) else None


BOOTED = ".booted"


def first_of_boot(store: Store, network: str, boot: str | None) -> bool:
    """Whether no call of `network` has noted boot `boot` yet (the caller holds the lock); notes it. An
    unknown boot, or a file that cannot be read or written, is never a first (nothing is noted)."""
    if not boot:
        return False
    seen = _load(store, BOOTED)
    if seen is None:
        from cni_reaper import log

        log.warn("the boots file cannot be read: it is written anew", file=f"{store.dir.root}/{BOOTED}")
        seen = {}
    if seen.get(network) == boot:
        return False
    seen[network] = boot
    try:
        store.dir.write(BOOTED, jsonio.dumps(seen).encode())
    except OSError:
        return False
    return True
