"""The engine (issue 42): the one pipeline every verb and command runs, each with a selection of its own.

    select -> observe the host -> judge -> plan -> apply -> settle

- select: which records and tagged attachments a pass works on (a verb's: what the index says is stale; GC's:
  what the runtime's valid list leaves out; the operator's: every record, with the scheduler's word and the
  orphans; a DEL's: its own record first);
- observe: reap/evidence.py, the only place that looks at the host, and only at what the judge asks;
- judge: judge/ (pure): a verdict per attachment, a mode per network (judge/modes.py, one answer), whose a
  reservation is (judge/reservations.py); who holds an address is reap/claims.Holdings, one answer;
- plan and apply: reap/cleanup.py under host-local's locks (the claims narrow each target to what is its
  alone), the planners and the backends;
- settle: a record goes only when everything it held is verified gone (reap/sweep.settle).

verbs/, tools/ and wrap/ ask the engine (this module) for a pass or a judgement; they never assemble one from
the stages. The stages live in reap/sweep.py, reap/claims.py and reap/cleanup.py.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from cni_reaper.judge.modes import ModeSources
    from cni_reaper.reap.evidence import View
    from cni_reaper.reap.hostlocal import Keeping
    from cni_reaper.reap.outcome import Outcome
    from cni_reaper.reap.scheduler import Word
    from cni_reaper.reap.targets import Target
    from cni_reaper.reap.undo import Report
    from cni_reaper.reap.word import Asked, Said
    from cni_reaper.state.names import Attached
    from cni_reaper.state.record import Life, Record
    from cni_reaper.state.store import Store
    from cni_reaper.values import DelCall, Key

from cni_reaper.judge import DEAD, Verdict


def add_pass(store: Store, conf: Any) -> Outcome | None:
    """An ADD's pass (its new life recorded: its addresses are protected): what the index says is stale, and on
    the first ADD of its network in a boot, the attachments libcni caches with no record that their entries
    prove dead, whose cached addresses must be forgotten before a late DEL of them meets their next holder
    (orphans.cached_dead). Never raises."""
    view = host_view()
    return verb_pass(store, conf, extra=_cached_dead(store, conf, view), view=view)


def _cached_dead(store: Store, conf: Any, view: View) -> list[Target]:
    from cni_reaper import log
    from cni_reaper.state.modes import first_of_boot

    try:
        if not first_of_boot(store, conf.name, view.host.boot):
            return []
        from cni_reaper.reap import orphans

        return orphans.cached_dead(conf, {e.key.owner for e in store.entries().values()}, view)
    except Exception as exc:  # noqa: BLE001 - a look at other attachments never fails this one
        log.warn("libcni's cached attachments without a record were not looked at", error=f"{type(exc).__name__}: {exc}")
        return []


def port_look(store: Store, conf: Any, container_id: str, ports: Any, life: Life, wait: float | None = None) -> None:
    """Who else maps the host ports an ADD was given (reap/orphans.py): the DNAT of a dead allocation with no
    record is removed with the rest of what it left (a pass under the state lock, observed as the ADD's network
    is), and the log says which port was freed from whom, or warns when its owner is live or not known dead.
    The tables are read with no lock held; the records (who has one) and the pass under the state lock, waited
    for `wait` seconds at most (None: lockTimeout; CniError 11 when it stays held)."""
    from cni_reaper.reap import orphans
    from cni_reaper.reap.holders import mapped_now
    from cni_reaper.reap.hostlocal import Keeping
    from cni_reaper.state.record import reservation_dir

    view = host_view()
    families = {ip.family for ip in life.ips} or {4}
    # host-local's word, where the ADD's own address shows it keeps the network: its dir and subnets
    keeping = Keeping(reservation_dir(life), [ip.cidr for ip in life.ips if ip.reservation is not None])
    shadows = orphans.shadowing(conf, container_id, ports, families, lambda: _recorded(store, wait), keeping, view)
    outcome = None
    if shadows.targets:
        with store.locked(wait):
            outcome = verb_pass(store, conf, extra=shadows.targets, view=view)
    orphans.report(shadows, outcome, container_id, lambda: mapped_now(conf.backend, families))


def _recorded(store: Store, wait: float | None = None) -> set[tuple[str, str]]:
    """The (network, container ID) of every record, read under the state lock."""
    with store.locked(wait):
        return {e.key.owner for e in store.entries().values()}


def can_wait(state_dir: str, call: DelCall) -> bool:
    """Whether nothing of a DEL's attachment must go before the downstream plugins' DEL (reap/teardown.py):
    asked by a wrapper before it runs the real plugin, with few imports."""
    from cni_reaper.reap.teardown import can_wait as nothing_must_go_first

    return nothing_must_go_first(state_dir, call)


def del_pass(conf: Any, call: DelCall, beside: bool, wait: float | None) -> None:
    """A DEL's pass (reap/teardown.py): its own attachment first (what must go before the downstream plugins'
    DEL, its tombstone), with the sweep of the other dead attachments; the mark settled. CniError 11 when the
    state lock stays held `wait` seconds (None: lockTimeout)."""
    from cni_reaper.reap.teardown import del_pass as teardown_pass

    teardown_pass(conf, call, beside, wait)


def verb_pass(store: Store, conf: Any, exclude: frozenset = frozenset(), extra: list[Target] | None = None,
              view: View | None = None) -> Outcome | None:
    """The pass of a verb whose own work is done (reap/sweep.sweep_quietly): what the index says is stale, and
    `extra` targets; nothing it meets fails the verb. None when nothing was stale."""
    from cni_reaper.reap.sweep import sweep_quietly

    return sweep_quietly(store, conf, exclude, extra, view)


def host_view(**kwargs: Any) -> View:
    """A pass's view of the host (reap/evidence.View): `at_once` (what is held looked at now), `recreate_wait`."""
    from cni_reaper.reap.evidence import View

    return View(**kwargs)


def await_lingering(v: View) -> bool:
    """STATUS's wait for the veths of namespaces just replaced at a recorded path (reap/evidence)."""
    from cni_reaper.reap.evidence import await_lingering as wait_for_them

    return wait_for_them(v)


def cached_unrecorded(cache_dir: str, recorded: Callable[[], Attached], network: str) -> bool:
    """An ADD's cheap look for leaks: whether libcni caches an attachment that has no record (`recorded`: the
    records as libcni names them, state/names.Attached; asked only when something is cached; reap/cache)."""
    from cni_reaper.reap.cache import unrecorded

    return unrecorded(cache_dir, recorded, network)


def judged(records: Iterable[Record], view: View, confs: dict[str, Any], cache_dir: str) -> dict[Key, Verdict]:
    """Each record's verdict, judged as every pass judges it (with its own settings, or its network's `confs`
    for a record of cni-reaper 0.2; `cache_dir`: where libcni's cache is looked for then): list, doctor."""
    from cni_reaper.reap.sweep import judge, settings_of

    out = {}
    for r in records:
        j = judge(r, view, settings_of(r, confs), cache_dir)
        out[r.key] = Verdict(j.state, j.why)
    return out


def life(life: Life, view: View) -> Verdict:
    """One life's verdict on the host's own evidence (the scheduler's word asks it of an allocation's namespace)."""
    from cni_reaper.reap.evidence import Facts, judge_life

    state, why = judge_life(Facts.of_life(life), view)
    return Verdict(state, why)


def holdings(records: Iterable[Record], view: View, confs: dict[str, Any], cache_dir: str) -> dict[Key, set[str]]:
    """Who holds which addresses, as every pass judges it (record key -> the addresses of its lives that are not
    dead): what undo may not put back."""
    from cni_reaper.reap.sweep import holdings as judged_holdings

    return judged_holdings(records, view, confs, cache_dir)


def holds(pairs: set[tuple[str, str]], cid: str, ifname: str) -> bool:
    """Whether (cid, ifname) is among `pairs` (GC's valid list, the live records); an empty ifname on either side
    matches any ifname."""
    return (cid, ifname) in pairs or (cid, "") in pairs or (not ifname and any(c == cid for c, _ in pairs))


def gc_pass(store: Store, conf: Any, valid: set[tuple[str, str]]) -> Outcome:
    """GC (CNI 1.1): every attachment of conf's network that the runtime's valid list (`valid`: (container ID,
    ifname) pairs, holds) does not name is dead by the runtime's word: its record, and the tagged rules and
    reservations of such containers with no record; one pass, every other network's dead attachments included,
    at once (what something not ours held is looked at now). The caller holds the state lock."""
    from cni_reaper.reap import orphans
    from cni_reaper.reap.sweep import network_modes, select, sweep, sweep_modes

    records = list(store.records())
    mine = [r for r in records if r.network == conf.name]
    verdicts = {r.key: Verdict(DEAD, "not among the runtime's valid attachments (GC)") for r in mine
                if not holds(valid, r.container_id, r.ifname)}
    sel = select(records, host_view(at_once=True), {conf.name: conf}, conf, verdicts=verdicts)
    live = {(k.container_id, k.ifname) for k in sel.holders if k.network == conf.name}  # every record not dead holds
    recorded = {(r.network, r.container_id) for r in mine}
    sel.extra = orphans.not_valid(conf, recorded, lambda cid: holds(valid, cid, ""))
    sel.extra += orphans.unheld_reservations(conf, lambda cid, ifn: holds(valid, cid, ifn) or holds(live, cid, ifn))
    return sweep(store, conf, sel, modes=sweep_modes(network_modes(store, conf), conf, store))


def operator_pass(store: Store | None, conf: Any, records: list[Record], view: View, confs: dict[str, Any],
                  modes: ModeSources, dry_run: bool, only_network: str | None = None,
                  verdicts: dict[Key, Verdict] | None = None, extra: list[Target] | None = None) -> Outcome:
    """The operator's sweep of one network (or of every one): every record, judged at once (what something not
    ours held is looked at now), with the scheduler's `verdicts` and the orphans found (`extra`)."""
    from cni_reaper.reap.sweep import select, sweep

    sel = select(records, view, confs, conf, only_network=only_network, verdicts=verdicts)
    sel.extra = list(extra or ())
    return sweep(store, conf, sel, dry_run=dry_run, modes=modes)


def outcome() -> Outcome:
    """An empty outcome, for a command that adds up several passes."""
    from cni_reaper.reap.outcome import Outcome

    return Outcome()


def host_local_holds_any(data_dir: str) -> bool:
    """Whether host-local has given out any address under `data_dir` (doctor: has any runtime added yet)."""
    from cni_reaper.reap.hostlocal import holds_any

    return holds_any(data_dir)


def keeping(data_dir: str = "", subnets: Iterable[str] = ()) -> Keeping:
    """Where a conflist says host-local keeps a network's addresses ("": not host-local, or not known)."""
    from cni_reaper.reap.hostlocal import Keeping

    return Keeping(data_dir, subnets)


def orphans_of(conf: Any, records: list[Record], network: str | None, said: Keeping | None, view: View) -> list[Target]:
    """The operator's orphan selection: the tagged attachments of `network` (None: of every network) with no
    record that libcni's cache or host-local proves dead. `said`: where the network's conflist says host-local
    keeps it (None: a network cni-reaper wraps, Nomad's bridge, host-local's where its records saw it); a
    conflist that names another directory than the records saw makes its reservations prove nothing."""
    from cni_reaper.reap import orphans
    from cni_reaper.reap.hostlocal import Keeping
    from cni_reaper.state.record import ips, network_dir

    recorded: dict[tuple[str, str], set[str]] = {}
    for r in records:
        recorded.setdefault((r.network, r.container_id), set()).update(ips(*r.lives))
    if not network:
        return orphans.proven_dead(conf, recorded, view, network)
    seen = network_dir(records, network)
    if said is None:
        said = Keeping(seen, {ip.cidr for r in records if r.network == network for life in r.lives for ip in life.ips})
    elif seen and seen != said.data_dir:
        view.note(f"host-local's directory of {network} is {said.data_dir or 'not host-local'} in its conflist, "
                  f"{seen} in its records: its reservations prove nothing")
        said = Keeping()
    return orphans.proven_dead(conf, recorded, view, network, said)


def ask_word(args: Any, records: Callable[[], list[Record]], view: View) -> Asked | None:
    """The scheduler's word on the allocations the records name, asked before any state lock (reap/word.py)."""
    from cni_reaper.reap import word

    return word.ask(args, records, view)


def word_verdicts(asked: Asked | None, records: list[Record], view: View, apply: bool, args: Any,
                  modes: ModeSources | None = None, store: Store | None = None) -> Said:
    """The verdicts of the records the word proves over (reap/word.verdicts), under the state lock."""
    from cni_reaper.reap import word

    return word.verdicts(asked, records, view, apply, args, modes, store)


def nomad_connection(args: Any) -> tuple[Word, str] | None:
    """The local Nomad agent's word on nothing, and its address: whether it answers (doctor); None: not configured."""
    from cni_reaper.reap import word

    return word.asked_of(args, set)


def undo(store: Store, cid: str, dry_run: bool, data_dirs: list[str], confs: dict[str, Any], cache_dir: str) -> Report:
    """Put back what the journal says was removed for `cid`, but what something live holds (reap/undo.py); the
    caller holds the state lock."""
    from cni_reaper.reap import undo as putting_back

    return putting_back.undo(store, cid, dry_run, data_dirs, confs, cache_dir)
