"""`sweep --nomad`: the scheduler's word (reap/scheduler.py) asked once per sweep, before the state lock is
taken, and turned into verdicts on the records it proves over (sweep.Verdict): the whole life goes as any dead
attachment's, but for the reservation while the allocation's namespace still holds the address (then the
record stays too, and says why). With `--nomad-remove-netns` (or CNI_REAPER_NOMAD_REMOVE_NETNS=1) the
namespace mount Nomad left is removed first, when nothing else holds the namespace; the allocation then loses
everything (its reservation at the next sweep when the kernel has not yet taken its veth). An allocation the word
proves over whose namespace a process is still in keeps everything.
"""

from __future__ import annotations

import os
import time

from cni_reaper import log
from cni_reaper.judge import DEAD, Verdict
from cni_reaper.reap import netns, nomad, probes, scheduler
from cni_reaper.reap.evidence import Facts, judge_life
from cni_reaper.state.journal import Journal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cni_reaper.judge.modes import ModeSources
    from cni_reaper.reap.evidence import View
    from cni_reaper.reap.scheduler import Word
    from cni_reaper.state.record import Record
    from cni_reaper.values import Key

REMOVE_ENV = "CNI_REAPER_NOMAD_REMOVE_NETNS"


def asked_of(args: Any, wanted: Callable[[], set[str]]) -> tuple[Word, str] | None:
    if not nomad.enabled(os.environ, getattr(args, "nomad", False)):
        return None
    try:
        conn = nomad.Connection.of_env(os.environ, getattr(args, "nomad_token_file", None))
    except nomad.Unreachable as exc:
        return scheduler.Word(time.time()).silent(str(exc)), ""
    return scheduler.ask(nomad.Agent(conn), wanted()), conn.address


def ask(args: Any, records: Callable[[], list[Record]], view: View) -> Asked | None:
    """The scheduler's word on the allocations the records name (`records`: read only when Nomad is
    configured; None: it is not); what it could not prove is noted in the view (the CLI's exit 6)."""
    glanced: list[Record] = []

    def wanted() -> set[str]:
        glanced.extend(records())
        return {r.container_id for r in glanced}

    asked = asked_of(args, wanted)
    if asked is None:
        return None
    word = asked[0]
    for problem in word.problems:
        view.note(f"Nomad: {problem}")
    return Asked(word, glanced)


class Asked:
    """The word, and who holds the namespaces of the lives it proves over, seen from /proc before the state
    lock is taken (a look at every thread and descriptor of the host costs about half a second per 100,000
    descriptors: no ADD waits on it). None when nothing glanced at is over."""

    __slots__ = ("occupancy", "word")

    def __init__(self, word: Word, glanced: list[Record]) -> None:
        self.word = word
        over = [r for r in glanced if _says(word, r) is not None]
        dirs = frozenset(os.path.realpath(os.path.dirname(r.current.netns)) for r in over)
        self.occupancy = netns.Occupancy(dirs) if over else None


class Said:
    """What a sweep takes from the word: the verdicts (record key -> sweep.Verdict) and the namespaces it
    removed ((network, "namespaces") -> how many), for the counters."""

    __slots__ = ("namespaces", "verdicts")

    def __init__(self) -> None:
        self.verdicts: dict[Key, Verdict] = {}
        self.namespaces: dict[tuple[str, str], int] = {}

    def count(self, store: Any, removed: Any) -> None:
        """Count in the state directory's metrics what went on the word (`removed`: Outcome.removed)."""
        from cni_reaper.state import counters

        counts, self.namespaces = dict(self.namespaces), {}  # counted once, whichever run of the sweep comes first
        for k, v in self.verdicts.items():
            if k in removed and v.parts is None:  # whole: counted once, when its last part went
                counts[(k.network, "attachments")] = counts.get((k.network, "attachments"), 0) + 1
        counters.add_by_kind(store, "schedulersWord", counts)


def verdicts(asked: Asked | None, records: list[Record], view: View, apply: bool, args: Any,
             modes: ModeSources | None = None, store: Any = None) -> Said:
    """The verdicts of the records the word proves over, but those whose namespace a process is still in;
    with --nomad-remove-netns and --apply, their namespace mounts go first when nothing else holds them (never
    of a network in observe mode: `modes`, judge/modes.ModeSources), each journaled in `store`'s journal
    before it goes. /proc was read once, before the lock (Asked); a record the word proves over that was not
    there then is left to the next sweep."""
    said = Said()
    if asked is None:
        return said
    _count_asked(asked.word, apply, store)
    remove = apply and store is not None and _removing(args)
    occupancy = asked.occupancy
    for r, why in _over(asked, records):
        assert occupancy is not None  # a record the word proves over was glanced at: /proc was read
        may_remove = remove and not (modes is not None and modes.observing(r.network))
        verdict = _judged(r, why, view, occupancy, said, store if may_remove else None)
        if verdict is not None:
            said.verdicts[r.key] = verdict
    return said


def _over(asked: Asked, records: list[Record]) -> list[tuple[Record, str]]:
    """The records the word proves over, and why, whose namespaces' directories /proc was read for (a record
    not glanced at before the lock is left to the next sweep)."""
    occupancy = asked.occupancy
    if occupancy is None:
        return []
    over = [(r, _says(asked.word, r)) for r in records]
    return [(r, why) for r, why in over
            if why is not None and os.path.realpath(os.path.dirname(r.current.netns)) in occupancy.dirs]


def _count_asked(word: Word, apply: bool, store: Any) -> None:
    """Note in the state directory's metrics whether a sweep that applies had the whole word (the alert on a
    word that stays unavailable, build/monitoring)."""
    if apply and store is not None:
        from cni_reaper.state import counters

        counters.word_asked(store, not word.problems, word.asked_at)


def _removing(args: Any) -> bool:
    """Whether namespace mounts are to go: --nomad-remove-netns, or CNI_REAPER_NOMAD_REMOVE_NETNS=1."""
    return bool(getattr(args, "nomad_remove_netns", False)) or \
        os.environ.get(REMOVE_ENV, "").strip().lower() in ("1", "true", "yes")


def _judged(r: Record, why: str, view: View, occupancy: netns.Occupancy, said: Said,
            store: Any) -> Verdict | None:
    """The verdict on one record the word proves over (None: a process is in its namespace); with `store`,
    its namespace mount is removed first, when nothing else holds it."""
    f = Facts.of_life(r.current)
    seen = _life(r, view)  # before any removal: a removal that failed half-way changes this view only
    if seen.state != DEAD:  # dead by the host's own evidence: its namespace is gone, its number may be another's
        why_not = _occupied(f, occupancy)
        if why_not is not None:
            view.note(f"Nomad says an allocation is over, but {why_not}: its tasks may still be stopping; "
                      "nothing of it was removed")
            return None
    if store is not None and _pinned_here(f) and _remove_netns(r, f, view, store, occupancy):
        said.namespaces[(r.network, "namespaces")] = said.namespaces.get((r.network, "namespaces"), 0) + 1
        seen = _life(r, view)
    return _verdict(why, seen)


def _life(r: Record, view: View) -> Verdict:
    """The verdict on the record's current life by the host's own evidence."""
    return Verdict(*judge_life(Facts.of_life(r.current), view))


def _occupied(f: Facts, occupancy: netns.Occupancy) -> str | None:
    """Why a process may be in a life's namespace (None: none is, as far as every thread was seen): its
    namespace is the one recorded, else the one its path holds now (a life recorded without it)."""
    ns = f.ns
    if ns is None:
        try:
            ns = probes.netns_id(f.netns)
        except probes.Unseen as exc:
            return f"its namespace cannot be told ({exc})"
    if ns is None:
        return "no namespace was recorded for it, and none is at its path to look into"
    pid = occupancy.process_in((ns.dev, ns.ino))
    if pid is not None:
        return f"a process is in its network namespace (pid {pid})"
    return occupancy.unseen()


def _says(word: Word, r: Record) -> str | None:
    """Why the word proves this record's attachment over (None: it does not, or a DEL ran: its tombstone is
    judged as ever, for the DEL may be in flight)."""
    if r.deleted is not None:
        return None
    return word.says_over(r.container_id, r.current.created, r.current.netns)


def _verdict(why: str, seen: Verdict) -> Verdict:
    """The word's verdict on a life the host judged `seen`."""
    from cni_reaper.reap.targets import PARTS

    if seen.state == DEAD:
        return Verdict(DEAD, why)
    return Verdict(DEAD, f"{why}; its reservation stays while its namespace holds the address ({seen.why}: "
                         "remove the namespace, or sweep with --nomad-remove-netns)", PARTS - {"reservation"})


def _pinned_here(f: Facts) -> bool:
    """Whether the life's path holds the very namespace recorded (the one Nomad made for the allocation)."""
    try:
        now = probes.netns_id(f.netns)
    except probes.Unseen:
        return False
    return (now is not None and f.ns is not None and (now.dev, now.ino) == (f.ns.dev, f.ns.ino)
            and f.ns.ctime is not None and now.ctime == f.ns.ctime)


def _remove_netns(r: Record, f: Facts, view: View, store: Any, occupancy: netns.Occupancy) -> bool:
    """Remove the namespace mount of a life the word proves over, unless something else would keep the
    namespace (and so its address) alive: journaled first, logged."""
    fields = {"network": r.network, "containerID": r.container_id, "netns": f.netns}
    assert f.ns is not None
    # a socket made inside, or a descriptor through a mount since detached, keeps a namespace no look at /proc
    # finds: only a veth going with it shows it gone, and only then may its address be given out again
    held = ("no veth was recorded to show it gone" if f.veth is None
            else occupancy.held_otherwise((f.ns.dev, f.ns.ino), f.netns))
    if held is not None:
        log.event("warning", "namespace kept", why=held, **fields)
        view.note(f"Nomad says an allocation is over, but its network namespace would outlive its mount: {held}")
        return False
    journal = Journal(store)
    try:
        event = journal.intent(log.field("verb"), [{"kind": "netns", "key": list(r.key), "netns": f.netns}])
    except OSError as exc:
        view.note(f"the journal cannot be written ({exc.strerror}): no namespace is removed unnoted")
        return False
    problem = netns.remove(f.netns)
    if problem is not None:
        log.event("warning", "namespace kept", why=problem, **fields)
        view.note(problem)
        return False
    journal.done(event, [0])
    log.event("info", "namespace removed", why="Nomad says its allocation is over and nothing else holds it", **fields)
    return True
