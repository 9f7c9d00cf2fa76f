"""The sweep, in stages: select (which records, judged how, what they hold) -> targets (the dead lives, with
their own settings) -> clean (cleanup.py) -> settle (drop what is verified gone, trim earlier lives, count).
Every verb (ADD, CHECK, DEL, STATUS, GC) and the CLI go through here; GC and the CLI hand in their own
records and verdicts, the verbs let the index say what is stale.

The common case costs next to nothing: the index (one small file) and a stat or two per record decide
that nothing is stale (`sweep_quietly`); only then are records read and the clean-up machinery imported.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from cni_reaper.judge.modes import ModeSources
    from cni_reaper.reap.outcome import Outcome
    from cni_reaper.reap.targets import Target
    from cni_reaper.state.index import Entry
    from cni_reaper.state.journal import Journal
    from cni_reaper.state.record import Life, Record
    from cni_reaper.state.store import Store
    from cni_reaper.values import Key

from cni_reaper import log
from cni_reaper.cni.conf import DEFAULT_IPAM_DIRS
from cni_reaper.judge import DEAD, DONE, HOLDING, LIVE, SWEEPABLE, UNKNOWN, WAIT, Verdict
from cni_reaper.reap import cache, probes
from cni_reaper.reap.evidence import Deleted, Facts, View, judge_attachment, judge_life, live_at_path
from cni_reaper.state.record import SCHEMA, RecordSettings, ips, parse_time


def settings_of(record: Record, confs: dict[str, Any]) -> RecordSettings | None:
    """A record's settings (state/record.RecordSettings): recorded with it; for a record of cni-reaper 0.2, its
    network's configuration when the sweep has it (None: this sweep must leave the record to a sweep that knows
    its network)."""
    if record.settings is not None:
        return record.settings
    conf = confs.get(record.network)
    return RecordSettings.of_conf(conf) if conf is not None else None


# -- judging ----------------------------------------------------------------------------------------
def _deleted(at: float | None, cached: bool | None, cache_dir: str, key: Key) -> Deleted | None:
    return None if at is None else Deleted(at, cached, lambda: cache.exists(cache_dir, *key))


def judge_record(record: Record, view: View, cache_dir: str, word: Verdict | None = None) -> Verdict:
    """A record's verdict (judge/life.decide_record on what it and the host say)."""
    dead, mark = record.deleted, record.left
    deleted = None if word is not None or dead is None else \
        _deleted(parse_time(dead.at), dead.cached, cache_dir, record.key)
    why = "" if mark is None else \
        mark.why + (f" (looked at again after {mark.retry_at})" if mark.retry_at is not None else "")
    later = (f"written by a later cni-reaper (schema {record.schema}): kept as it is, never judged, cleaned or "
             "dropped by this one") if record.schema > SCHEMA else None
    return judge_attachment(Facts.of_life(record.current), view, record.left_mark, why, deleted, word, unjudged=later)


def judge_entry(e: Entry, view: View, cache_dir: str) -> str:
    """An index entry's state: the same judgement as its record's."""
    deleted = _deleted(e.deleted_at, e.cached, e.cache_dir or cache_dir, e.key)
    return judge_attachment(Facts.of_entry(e), view, e.left, "", deleted).state


def judge_indexed(store: Store, view: View, cache_dir: str, every: bool = False) -> tuple[dict[str, Entry], dict[str, str]]:
    """The entries (all of them with `every`, else all but those seen LIVE in the quick batch) and each one's
    state (record file name -> state)."""
    live = live_at_path(store.quick(), view)
    entries = store.entries() if every else store.entries(but=live)
    return entries, {n: LIVE if n in live else judge_entry(e, view, cache_dir) for n, e in entries.items()}


class Judged:
    """A record and what was judged of it (and of each of its earlier lives)."""

    __slots__ = ("by_runtime", "earlier", "parts", "record", "settings", "state", "why")

    def __init__(self, record: Record, state: str, why: str, settings: RecordSettings | None,
                 earlier: list[tuple[str, str]], by_runtime: bool = False, parts: frozenset[str] | None = None) -> None:
        self.record, self.state, self.why, self.settings, self.earlier = record, state, why, settings, earlier
        self.by_runtime = by_runtime  # the verdict is the runtime's word (its DEL of it, GC's valid list, Nomad's)
        self.parts = parts  # the parts of its leftovers that may go (Verdict.parts; None: all)

    @property
    def key(self) -> Key:
        return self.record.key


class Selection:
    """What a sweep works on: the judged records it may act on, what every record holds (key -> addresses of
    the lives that are not dead: protected), extra targets with no record (orphans, GC's), and the view."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.judged: list[Judged] = []
        self.holders: dict[Key, set[str]] = {}
        self.extra: list[Target] = []
        self.data_dirs: list[str] = []

    def hold(self, k: Key, addresses: set[str]) -> None:
        self.holders.setdefault(k, set()).update(addresses)


def judge(r: Record, view: View, s: RecordSettings | None, cache_dir: str, verdict: Verdict | None = None) -> Judged:
    """The one judgement of a whole record, which every sweep, GC, DEL's own, undo's holders and `list` make:
    its state and why (the runtime's or the scheduler's `verdict` when given), made UNKNOWN when its rules are
    out of this process's reach, and each earlier life's. `s`: its settings (None: cni-reaper 0.2's, whose
    libcni cache is looked for in `cache_dir`)."""
    v = judge_record(r, view, s.cni_cache_dir if s is not None else cache_dir, verdict)
    state, why = v.state, v.why
    earlier = [judge_life(Facts.of_life(life), view) for life in r.earlier]
    if state == UNKNOWN:
        view.note(why)
    by_word = verdict if verdict is not None and state == DEAD else None
    return Judged(r, state, why, s, earlier, by_runtime=by_word is not None, parts=by_word.parts if by_word else None)


def holdings(records: Iterable[Record], view: View, confs: dict[str, Any], cache_dir: str) -> dict[Key, set[str]]:
    """Who holds which addresses, as every sweep judges it (record key -> the addresses of its lives that are
    not dead, _note_holdings): what undo may not put back (claims.Holdings). `confs` and `cache_dir`: as
    select's and list's (a record of cni-reaper 0.2 is judged with its network's settings)."""
    sel = Selection(view)
    for r in records:
        j = judge(r, view, settings_of(r, confs), cache_dir)
        _note_holdings(sel, r, j.state, j.earlier, False)
    return sel.holders


def _judge(sel: Selection, r: Record, confs: dict[str, Any], default: Any, exclude: frozenset,
           verdict: Verdict | None) -> Judged:
    """Judge one record, and note what it holds: the addresses of each of its lives that is not dead (all of
    them while the record is unknown or its DEL is running; the current ones of the DEL's own record)."""
    s = settings_of(r, confs)
    j = judge(r, sel.view, s, default.cniCacheDir, verdict)
    _note_holdings(sel, r, j.state, j.earlier, r.key in exclude)
    if s is not None:
        sel.data_dirs.append(s.ipam_data_dir)
    return j


def _note_holdings(sel: Selection, r: Record, state: str, earlier: list[tuple[str, str]], excluded: bool) -> None:
    """The addresses a judged record holds: its current life's unless dead (or the DEL's own record), each
    earlier life's unless dead (all of them while the record is unknown or its DEL is running)."""
    k = r.key
    if state in HOLDING or excluded:
        sel.hold(k, r.current.addresses)
    for life, (st, _) in zip(r.earlier, earlier):
        if st != DEAD or state in (UNKNOWN, WAIT):
            sel.hold(k, life.addresses)


def select(records: Iterable[Record], view: View, confs: dict[str, Any], default: Any,
           exclude: frozenset = frozenset(), only_network: str | None = None,
           verdicts: dict[Key, Verdict] | None = None) -> Selection:
    """Judge `records` (or take `verdicts` for them: GC's, Nomad's). `confs`: network -> its configuration, for
    records that carry no settings; `default`: the caller's configuration (its data dir is looked at too)."""
    sel = Selection(view)
    for r in records:
        j = _judge(sel, r, confs, default, exclude, (verdicts or {}).get(r.key))
        if j.key in exclude or (only_network and r.network != only_network):
            continue
        if j.settings is None:
            if j.state in SWEEPABLE or j.record.earlier:
                view.note(f"a record of cni-reaper 0.2 of network {r.network} waits for a sweep that knows "
                          "that network's settings")
            continue
        sel.judged.append(j)
    sel.data_dirs.append(default.ipamDataDir)
    return sel


def select_indexed(store: Store, view: View, conf: Any, exclude: frozenset = frozenset()) -> Selection:
    """The selection of a verb's sweep from the index: records are read only when the index says they are
    to be cleaned, have earlier lives, or cannot be judged (what they hold must be known whole)."""
    sel = Selection(view)
    entries, states = judge_indexed(store, view, conf.cniCacheDir, every=True)
    wanted = [name for name, e in entries.items() if _read_whole(sel, e, states[name], exclude)]
    records = [r for r in (store.load_named(n) for n in wanted) if r is not None]
    for r in records:
        j = _judge(sel, r, {conf.name: conf}, conf, exclude, None)
        if j.key not in exclude and j.settings is not None:
            sel.judged.append(j)
    sel.data_dirs.append(conf.ipamDataDir)
    return sel


def _read_whole(sel: Selection, e: Entry, state: str, exclude: frozenset) -> bool:
    """Whether an index entry's record is to be read (cleaned, earlier lives, not judged); else what it holds
    is noted from the entry alone, when it holds anything."""
    whole = state in SWEEPABLE or bool(e.earlier) or state == UNKNOWN
    if not whole and (state in HOLDING or e.key in exclude):
        sel.hold(e.key, set(e.ips))
    return whole


# -- targets ------------------------------------------------------------------------------------------
def _expect(life: Life, record: Record, s: RecordSettings, view: View) -> dict[str, Any]:
    """What each address of a life expects its own reservation to be (targets.Expect)."""
    import time

    from cni_reaper.judge.reservations import bound
    from cni_reaper.reap.targets import Expect

    out = {}
    host = life.host
    rebooted = host is not None and view.host.boot is not None and probes.same_boot(host.boot, view.host.boot) is False
    owner = (record.container_id, record.ifname)
    for ip in life.ips:
        r = ip.reservation
        if r is not None:
            out[ip.address] = Expect(r.data_dir, owner, (r.ino, r.mtime, r.ctime), dev=r.dev, rebooted=rebooted)
        elif host is None:  # recorded by cni-reaper 0.2: a reservation naming it, older than the life (its time
            # ahead of now, written while the clock ran ahead, bounds nothing: judge/reservations.bound)
            out[ip.address] = Expect(s.ipam_data_dir, owner, not_after=bound(int(life.created * 1e9), time.time_ns()))
    return out


def _forming(life: Life) -> bool:
    """Its path holds a namespace other than its own and no reservation was recorded for it (so none can tell
    whether a new life of its container is being made there)."""
    if life.host is None or life.reserved:
        return False
    return probes.maybe_there(life.netns)


def dead_target(j: Judged, view: View, keep_masq_chain: bool = False, parts: Iterable[str] | None = None,
                lives: list[Life] | None = None) -> Target:
    """The dead lives of a record (all of them by default; the current one and the earlier ones judged dead)."""
    from cni_reaper.reap.targets import PARTS, Target

    r, s = j.record, j.settings
    assert s is not None
    if lives is None:
        lives = [r.current] + [life for life, (st, _) in zip(r.earlier, j.earlier) if st == DEAD]
    expect: dict[str, Any] = {}
    for life in reversed(lives):  # the newest life's expectation wins for an address two lives held
        expect.update(_expect(life, r, s, view))
    whole = len(lives) == 1 + len(r.earlier)
    return Target(*r.key, frozenset(ips(*lives)), whole=whole, keep_masq_chain=keep_masq_chain,
                  parts=frozenset(parts) if parts is not None else j.parts or PARTS, expect=expect, backend=s.backend,
                  cache_dir=s.cni_cache_dir, forming=_forming(r.current) and not j.by_runtime, by_runtime=j.by_runtime)


def earlier_target(j: Judged, view: View) -> Target | None:
    """The addresses of a live record's earlier lives that are judged dead and that its current life does not hold."""
    from cni_reaper.reap.targets import PARTS, Target

    r, s = j.record, j.settings
    assert s is not None
    dead = [life for life, (st, _) in zip(r.earlier, j.earlier) if st == DEAD]
    old = ips(*dead) - r.current.addresses
    if not old:
        return None
    expect: dict[str, Any] = {}
    for life in reversed(dead):
        expect.update({a: e for a, e in _expect(life, r, s, view).items() if a in old})
    return Target(*r.key, frozenset(old), whole=False, parts=PARTS, expect=expect, backend=s.backend,
                  cache_dir=s.cni_cache_dir)


def targets_of(sel: Selection) -> list[Target]:
    out: list[Target] = list(sel.extra)
    for j in sel.judged:
        if j.state in SWEEPABLE and not _finished_del(j):
            out.append(dead_target(j, sel.view))
        elif j.state == LIVE and j.record.earlier:
            t = earlier_target(j, sel.view)
            if t is not None:
                out.append(t)
    return out


# -- the sweep ----------------------------------------------------------------------------------------
def sweep(store: Store | None, conf: Any, sel: Selection, dry_run: bool = False, backend_for: Any = None,
          modes: ModeSources | None = None, ipam_wait: float | None = None) -> Outcome:
    """Clean what the selection's dead lives and extra targets left behind, then settle the records. The
    caller holds the state lock; `store` None: there are no records (only extra targets). `modes`: network ->
    clean or observe; what a network in observe mode would lose is planned and reported, never removed.
    `ipam_wait`: how long host-local's locks are waited for (None: lockTimeout, an operator's or GC's sweep; a
    verb's, the most it may delay its allocation: then a dry run for an observed network does not wait at all);
    a lock held longer keeps what it guards, and its record, for a later call."""
    from cni_reaper.reap.outcome import Outcome
    from cni_reaper.state.journal import Journal

    targets = targets_of(sel)
    if not targets and not any(j.state in SWEEPABLE for j in sel.judged):
        out = Outcome()
        out.unknown = dict(sel.view.blind)
        return out
    started = time.monotonic()
    watching = _watching(sel, targets, modes, getattr(conf, "stateDir", None) or "")
    journal = Journal(store) if store is not None and not dry_run else None
    waits = (None, None) if ipam_wait is None else (ipam_wait, 0.0)
    outcome = _cleaned(store, conf.lockTimeout, waits, sel, targets, watching, dry_run, backend_for, journal)
    _note_unproven(sel, outcome)
    outcome.unknown = dict(sel.view.blind)
    if journal is not None and store is not None:
        settle(store, sel, targets, outcome, time.monotonic() - started, watching, journal)
    return outcome


class Watched:
    """What this sweep observes (judge/modes: the one answer): the networks observed for every target of
    theirs, and the targets found with no record observed for what their own attachment shows (`strays`: of a
    network whose cached conflist, for that attachment, chains no cni-reaper)."""

    __slots__ = ("networks", "strays")

    def __init__(self, networks: set[str], strays: set[Key]) -> None:
        self.networks, self.strays = networks, strays

    def record(self, key: Key) -> bool:
        return key.network in self.networks

    def target(self, t: Target) -> bool:
        return t.network in self.networks or t.key in self.strays


def _watching(sel: Selection, targets: list[Target], modes: ModeSources | None, state_dir: str) -> Watched:
    """What this sweep observes (Watched)."""
    if modes is None:
        return Watched(set(), set())
    recorded = {j.key for j in sel.judged}
    strays = [t for t in targets if t.key not in recorded]
    chained, unchained = _cached_conflists(strays, state_dir)
    modes = modes.with_cached(chained, set())
    networks = {j.key.network for j in sel.judged} | {t.network for t in targets}
    observed = {n for n in networks if modes.observing(n)}
    if not unchained:
        return Watched(observed, set())
    stray_modes = modes.with_cached({}, unchained)
    return Watched(observed, {t.key for t in strays if stray_modes.observing(t.network)})


def _cached_conflists(strays: list[Target], state_dir: str) -> tuple[dict[str, str], set[str]]:
    """What the conflists libcni cached with the attachments found with no record say (reap/cache.chained_modes):
    the mode of a network that chains cni-reaper where no source here knows it (another state directory, a
    conflist the CLI does not read), and the networks whose attachment chains none (made before cni-reaper was
    installed, or after it was taken out: the finder's mode governs them)."""
    by_cache: dict[str, set[tuple[str, str]]] = {}
    for t in strays:
        if t.cache_dir:
            by_cache.setdefault(t.cache_dir, set()).add((t.network, t.container_id))
    chained: dict[str, str] = {}
    unchained: set[str] = set()
    if by_cache:
        from cni_reaper.judge.modes import strictest
        from cni_reaper.reap.cache import chained_modes

        for cache_dir, keys in by_cache.items():
            modes, none = chained_modes(cache_dir, sorted(keys), state_dir)
            chained.update({n: strictest(m, chained.get(n)) for n, m in modes.items()})
            unchained |= none
    return chained, unchained


def _cleaned(store: Store | None, lock_timeout: float, waits: tuple[float | None, float | None], sel: Selection,
             targets: list[Target], watching: Watched, dry_run: bool, backend_for: Any, journal: Any) -> Outcome:
    """Clean the targets of networks in clean mode; plan (a dry run) those of networks in observe mode. `waits`:
    how long host-local's locks are waited for by each (None: lock_timeout)."""
    from cni_reaper.reap.cleanup import CleanupOptions, clean

    data_dirs = [*sel.data_dirs, *DEFAULT_IPAM_DIRS]
    outcome = clean([t for t in targets if not watching.target(t)], sel.holders,
                    CleanupOptions(data_dirs, lock_timeout, backend_for, dry_run, journal, log.field("verb"), waits[0]))
    watched = [t for t in targets if watching.target(t)]
    if watched:
        seen = clean(watched, sel.holders, CleanupOptions(data_dirs, lock_timeout, backend_for, dry_run=True,
                                                          lock_wait=waits[1]))
        _observed(store if not dry_run else None, sel, seen, outcome)
    return outcome


def _observed(store: Store | None, sel: Selection, seen: Outcome, outcome: Outcome) -> None:
    """What the networks in observe mode would have lost (`seen`, a dry run) goes into the outcome, and, when
    a store is given, into the log and the would-remove counters."""
    outcome.would, outcome.would_counts = seen.removed, seen.counts
    outcome.errors += seen.errors
    outcome.waiting.update(seen.waiting)
    if store is not None:
        report_observed(store, seen, reasons(sel))


def _note_unproven(sel: Selection, outcome: Outcome) -> None:
    """Attachments known by their tags alone that host-local did not prove dead are not known: said."""
    for t in sel.extra:
        why = outcome.waiting.get(t.key) if t.reserved_in else None
        if why is not None:
            sel.view.note(f"tagged attachments without a record or a libcni cache entry: {why}")


def reasons(sel: Selection) -> dict[Key, str]:
    """Why each attachment of the selection is a target: its judgement, or that an earlier life is dead."""
    return {j.key: j.why if j.state in SWEEPABLE else "an earlier life of it is dead" for j in sel.judged}


def report_observed(store: Store, seen: Outcome, why: dict[Key, str] | None = None) -> None:
    """Observe mode: a "would remove" line (and the would-remove counters) per attachment and change of what it
    would remove, not per call; with why it was judged dead (an attachment known only by its tags: by them
    and libcni's cache, or by GC's valid list)."""
    from cni_reaper.state import counters, modes

    digest = modes.observed(store)
    keys = {"\0".join(e.key) for e in store.entries().values()} if store.index is not None else set()
    fresh: dict[tuple[str, str], int] = {}
    for k, items in seen.removed.items():
        name, mark = "\0".join(k), "\0".join(sorted(items))
        if digest.get(name) == mark:
            continue
        digest[name] = mark
        keys.add(name)
        log.info("would remove", network=k.network, containerID=k.container_id, ifname=k.ifname, items=items, mode="observe",
                 why=(why or {}).get(k, "no record: found by its tags, dead by libcni's cache or GC's valid list"))
        for (network, kind), n in seen.counts.items():
            if network == k.network:
                fresh[(network, kind)] = fresh.get((network, kind), 0) + n
    modes.save_observed(store, {k: v for k, v in digest.items() if k in keys})
    if fresh:
        counters.add_would(store, fresh)


def _left_for_the_runtime(store: Store, j: Judged, outcome: Outcome, watching: Watched) -> bool:
    """A dead attachment whose leftovers the claims could not give to the sweep (no reservation shows who else
    holds them): its record stays, marked, for the runtime's DEL or GC, and no sweep looks at it again."""
    from cni_reaper.state.record import left

    why = outcome.waiting.get(j.key)
    if why is None or j.state != DEAD or j.record.deleted is not None or watching.record(j.key):
        return False
    store.save(j.record.replace(left=left(why)))
    log.info("left for the runtime's DEL or GC", network=j.key.network, containerID=j.key.container_id,
             ifname=j.key.ifname, why=why)
    return True


def _held(store: Store, j: Judged, outcome: Outcome, watching: Watched) -> bool:
    """A dead attachment of which something not ours holds a leftover (a foreign rule jumps to its chain): its
    record stays, marked with when a verb's sweep looks at it again (sooner would cost every verb a sweep;
    the wait doubles each time, up to an hour; an operator's sweep and GC look at once)."""
    from cni_reaper.state.record import held

    why = outcome.held.get(j.key)
    if why is None or j.state not in SWEEPABLE or watching.record(j.key):
        return False
    mark = held(why, j.record.left)
    store.save(j.record.replace(left=mark))
    log.info("left in place: something not ours holds it; looked at again later", network=j.key.network,
             containerID=j.key.container_id, ifname=j.key.ifname, why=why, retryAt=mark.retry_at, tries=mark.tries)
    return True


def _finished_del(j: Judged) -> bool:
    """A record whose own DEL finished its clean-up (a tombstone that needs no look at the tables)."""
    return j.state == DONE and j.record.deleted is not None and not j.record.deleted.verify


def _settling(j: Judged, watching: Watched) -> tuple[Life, ...] | None:
    """The earlier lives a record keeps when its clean-up went through (None: it is not settled now). A
    record of a dead attachment is dropped; one whose dead earlier lives were cleaned is trimmed."""
    r = j.record
    if watching.record(j.key) and not _finished_del(j):
        return None  # observe mode: nothing of it was removed
    kept = tuple(life for life, (st, _) in zip(r.earlier, j.earlier) if st != DEAD)
    if not (j.state in SWEEPABLE or (j.state == LIVE and len(kept) != len(r.earlier))):
        return None
    return kept


def _settle_all(store: Store, due: list[tuple[Judged, tuple[Life, ...]]], journal: Journal) -> list[Judged]:
    """Drop or trim the records `due`, each as it was journaled first (undo puts it back; one fsync for all);
    the judged records that were dropped."""
    from cni_reaper.state.journal import batches

    items = [{"kind": "record", "key": list(j.key), "record": store.as_read(j.record)} for j, _ in due]
    dropped: list[Judged] = []
    for start, end, dumped in batches(items):
        try:
            event = journal.intent(log.field("verb"), items[start:end], dumped)
        except OSError:
            return dropped  # not noted: the records stay, and so they are looked at again
        dropped += _settle_batch(store, due[start:end])
        journal.done(event, list(range(end - start)))
    return dropped


def _settle_batch(store: Store, due: list[tuple[Judged, tuple[Life, ...]]]) -> list[Judged]:
    """One journaled batch: the dead records removed, the others trimmed to the lives they keep; raises the
    first removal that failed (the others of the batch went: the next sweep looks at those that did not)."""
    gone = [j for j, _ in due if j.state in SWEEPABLE]
    errors = store.remove_all([j.key for j in gone])
    went = [j for j, error in zip(gone, errors) if error is None]
    log.each("info", "record dropped", [_said(j) for j in went])
    failed = next(filter(None, errors), None)
    if failed is not None:
        raise failed
    for j, kept in due:
        if j.state not in SWEEPABLE:
            store.save(j.record.replace(earlier=kept))
    return went


def _said(j: Judged) -> dict[str, str]:
    """A judged record as a log line names it."""
    return {"network": j.key.network, "containerID": j.key.container_id, "ifname": j.key.ifname, "state": j.state,
            "why": j.why}


def _due(store: Store, sel: Selection, outcome: Outcome, watching: Watched) -> list[tuple[Judged, tuple[Life, ...]]]:
    """The judged records to settle, each with what of it is kept (_settling): not those left for the
    runtime, kept by the clean-up, or held by something not ours."""
    due = []
    for j in sel.judged:
        if _left_for_the_runtime(store, j, outcome, watching) or j.key in outcome.kept:
            continue
        if j.state in SWEEPABLE and j.parts is not None:  # a part of it stays by its verdict: so does its record
            outcome.skipped.append(f"{' '.join(j.key).strip()}: record kept: {j.why}")
            continue
        if _held(store, j, outcome, watching):
            continue
        kept = _settling(j, watching)
        if kept is not None:
            due.append((j, kept))
    return due


def settle(store: Store, sel: Selection, targets: list[Target], outcome: Outcome, seconds: float,
           watching: Watched, journal: Journal) -> None:
    """Drop the records whose leftovers are verified gone, trim the earlier lives that were cleaned, count.
    Records of networks in observe mode stay as they are (nothing of theirs was removed), but for finished DELs
    that left nothing to look at."""
    from cni_reaper.state import counters

    cleaned: dict[str, int] = {}
    for j in _settle_all(store, _due(store, sel, outcome, watching), journal):
        if j.state != DONE or j.key in outcome.removed:  # a DEL that went well is no dead attachment
            cleaned[j.key.network] = cleaned.get(j.key.network, 0) + 1
    for t in sel.extra:  # attachments with no record (orphans, GC's): cleaned if something of theirs was
        if t.whole and t.key in outcome.removed and t.key not in outcome.kept:
            cleaned[t.network] = cleaned.get(t.network, 0) + 1
    store.sync()
    if outcome.removed or cleaned or outcome.errors:
        counters.add(store, outcome, cleaned, seconds)


# -- the sweep of a verb ----------------------------------------------------------------------------
def stale(store: Store, conf: Any, view: View, exclude: frozenset = frozenset()) -> tuple[bool, list[Key]]:
    """From the index alone: (whether any record is to be cleaned, the finished DELs whose records can go
    without a look at the tables)."""
    found, done = False, []
    entries, states = judge_indexed(store, view, conf.cniCacheDir)
    for name, e in entries.items():
        if exclude and e.key in exclude:
            continue
        state = states[name]
        if state == DONE and not e.verify:
            done.append(e.key)
        elif state in SWEEPABLE or (state == LIVE and e.earlier):
            found = True
    return found, done


def network_modes(store: Store, conf: Any) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    """What the state directory knows of each network's mode, its conflist's and its wrapper's (this call's
    noted): state/modes.network_modes."""
    from cni_reaper.state import modes

    return modes.network_modes(store, conf)


def sweep_modes(noted: tuple[dict[str, str] | None, dict[str, str] | None], conf: Any, store: Store) -> ModeSources:
    """The modes of a verb's sweep (judge/modes): state/modes.verb_sources."""
    from cni_reaper.state import modes

    return modes.verb_sources(noted, conf, store)


# seconds a verb's sweep waits for host-local's lock of a network (its own network's plugins have let it go by
# then: another process holds it, for milliseconds when it is host-local): what stays held is for a later call
VERB_IPAM_WAIT = 1.0


def sweep_quietly(store: Store, conf: Any, exclude: frozenset = frozenset(), extra: list[Target] | None = None,
                  view: View | None = None) -> Outcome | None:
    """The sweep of a verb whose own work is done: nothing it meets fails the verb. With nothing stale it
    costs the index and a stat or two per record, and imports nothing more. Returns the outcome, or None when
    nothing was stale."""
    try:
        noted = network_modes(store, conf)  # every call says its network's mode, stale or not: others' sweeps read it
        view = view or View()
        found, done = stale(store, conf, view, exclude)
        for k in done:
            store.remove(*k, sync=False)
        if done:
            store.sync()
            log.info("records of finished DELs dropped", count=len(done))
        if not extra and not found:
            return None
        sel = select_indexed(store, view, conf, exclude)
        sel.extra = list(extra or ())
        return sweep(store, conf, sel, modes=sweep_modes(noted, conf, store), ipam_wait=VERB_IPAM_WAIT)
    except Exception as exc:  # noqa: BLE001 - a sweep never fails the verb that runs it
        log.warn("sweep failed; will retry on a later call", error=f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        return None
