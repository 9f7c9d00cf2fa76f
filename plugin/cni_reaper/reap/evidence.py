"""The judgement of life and death, in one place (docs/how-it-works.md, "Evidence").

cni-reaper may delete a live node's rules and release its addresses: it does so only for what positive
evidence, seen from a view known to be complete, says is dead. Absence is never evidence: a missing cache,
a netns directory this process cannot see, /proc not mounted, an unreadable IPAM directory, a recycled
inode, an ADD still in flight. When the evidence is not there the answer is UNKNOWN, and nothing that
depends on it is removed; the reason is given to the log, the CLI and `doctor`.

A recorded life (one ADD of an attachment) is
- dead when the host has booted since it was recorded (namespaces never survive a boot), the boot IDs read
  in the same view (both from /proc, or both from a file mounted over it: probes.same_boot); when, in a view of
  its netns directory that is the one it was recorded in (same directory: device and inode), its netns path
  holds no namespace or another one (another inode, or the same recycled inode made at another time); or
  when, in the network namespace it was recorded in, the host side of its veth pair is gone or is another
  link (the pair dies with the container's namespace, and that is seen from any mount namespace);
- alive when its path still holds the very namespace recorded, or its veth is still there (the STATUS before a
  recreate's ADD waits a while, holding no lock, for the veth of a namespace just replaced at its path, then
  sweeps again: await_lingering);
- unknown otherwise: /proc is not there, the state was written on another machine, the netns directory here
  is another one (a private mount namespace, a tmpfs over /var/run/netns) and the veth cannot be looked at
  (none recorded, or this process runs in another network namespace).
Alive wins over dead. A record of cni-reaper 0.2 (no boot, directory or veth recorded) is judged by its path
alone, and only where its directory is one that a record of this boot verifies.

A tombstone (the runtime sent DEL) is done when libcni's cache held the attachment at DEL time and no longer
does (libcni deletes it when, and only when, the whole chain's DEL succeeded); expired when the DEL is long
over and its life is dead by the rules above; waiting otherwise.

An attachment found only by its tags (no record) is dead when libcni caches it and every cached life's netns
path is gone in a verified directory, and no veth of it is left; without a cache entry nothing is known
(an ADD in flight writes its entry only when the whole chain is done). A GC's valid list is the runtime's
word: whatever is not in it is dead.

What may still be forming is protected by `claims.py`, under host-local's lock.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cni_reaper.state.index import Entry, QuickView
    from cni_reaper.state.record import DirId, HostId, Life, NetnsId, Veth

from cni_reaper import log
from cni_reaper.judge import DEAD, LIVE, Verdict
from cni_reaper.judge.life import Sign, decide_cached, decide_life, decide_record
from cni_reaper.reap import probes
from cni_reaper.state.record import HELD_MAX_SECONDS

TOMBSTONE_GRACE_SECONDS = 60.0


class Facts:
    """What a life's record (or its index entry) says that the judgement reads: its netns path, the namespace
    (NetnsId), the directory's (device, inode) and peer groups, the host, the veth (None where not known)."""

    __slots__ = ("boot", "dir", "groups", "host_netns", "machine", "mnt", "netns", "ns", "veth", "veth_index")

    def __init__(self, netns: str, ns: NetnsId | None, dir_: DirId | None, host: HostId | None,
                 veth: Veth | None) -> None:
        self.netns, self.ns = netns, ns
        self.dir = (dir_.dev, dir_.ino) if dir_ else None
        self.groups = dir_.groups if dir_ else None
        self.boot: str | None = host.boot if host else None
        self.machine = host.machine if host else ""
        self.host_netns: int | None = host.netns if host else None
        self.mnt: int | None = host.mnt if host else None
        self.veth: str | None = veth.name if veth else None
        self.veth_index: int | None = veth.ifindex if veth else None

    @classmethod
    def of_life(cls, life: Life) -> Facts:
        return cls(life.netns, life.netns_id, life.netns_dir, life.host, life.veth)

    @classmethod
    def of_entry(cls, e: Entry) -> Facts:
        return cls(e.netns, e.netns_id, e.netns_dir, e.host_id, e.veth_id)


class View:
    """What this process can see now: the host, and per sweep the identities of the netns directories it looked
    at and the peer groups of the mounts they are on. `blind`: why something could not be judged, how often.
    `at_once`: what is held waits for no retry time (an operator's sweep, GC: judge_left). `recreate_wait`:
    for how many seconds after another namespace was put at a life's path its veth, which the kernel takes
    down some time after the last holder of the recorded namespace went (under load, seconds later), may be
    waited for: such veths are noted in `lingering` (the STATUS before a recreate's ADD waits for them with
    no lock held, await_lingering, and sweeps again); 0: none is noted."""

    def __init__(self, host: probes.Host | None = None, at_once: bool = False, recreate_wait: float = 0.0) -> None:
        self.host = host or probes.host()
        self.at_once = at_once
        self.recreate_wait = recreate_wait
        self.lingering: list[Lingering] = []
        self._dirs: dict[str, tuple | None] = {}
        self._groups: dict[tuple[str, str, tuple[bytes, ...]], frozenset[int]] = {}
        self.blind: dict[str, int] = {}

    def dir_now(self, path: str) -> tuple | None:
        if path not in self._dirs:
            d = probes.dir_id(path)
            self._dirs[path] = (d.dev, d.ino) if d else None
        return self._dirs[path]

    def groups(self, where: str, mountinfo: str = "/proc/self/mountinfo",
               kinds: tuple[bytes, ...] = probes.RECEIVES) -> frozenset[int]:
        k = (where, mountinfo, kinds)
        if k not in self._groups:
            self._groups[k] = frozenset(probes.mount_groups(where, mountinfo, kinds) or ())
        return self._groups[k]

    def sees_mounts_of(self, f: Facts, where: str) -> bool:
        """Whether a namespace mounted in `where` where the life was recorded is mounted here too: the same
        mount namespace, or a mount of `where` here that is a member or a slave of the peer group the recorded
        mount was a member of (a mount propagates to every member and slave of its group, never to the group
        a slave's master is in). A record of cni-reaper 0.2 names no mount namespace: its runtime is taken to
        be where PID 1 is.

        The same number is the same mount namespace only while the one recorded is alive: the kernel gives a
        freed namespace's inode number to the next one made (a runtime's transient namespace gone, the timer's
        service or `ip netns exec` gets its number). PID 1's lives as long as the boot, so a recorded number
        that is PID 1's now was PID 1's then; any other is judged by the peer groups alone."""
        if f.mnt is not None:
            if f.mnt == self.host.mnt and f.mnt == probes.init_mnt():
                return True
            return bool(f.groups and self.groups(where) & set(f.groups))
        init = probes.init_mnt()
        if init is not None and init == self.host.mnt:
            return True
        return bool(self.groups(where) & self.groups(where, "/proc/1/mountinfo", probes.SENDS))

    def note(self, why: str) -> None:
        self.blind[why] = self.blind.get(why, 0) + 1


def _path_evidence(f: Facts, view: View) -> tuple[str | None, str]:
    try:
        now = probes.netns_id(f.netns)
    except probes.Unseen as exc:
        return None, str(exc)
    if now is not None and f.ns is None:
        return LIVE, "a namespace is at its path (none was recorded)"
    if now is not None and f.ns is not None and now.same(f.ns):
        return LIVE, "its path holds the namespace recorded"
    where = probes.netns_dir(f.netns)
    current = view.dir_now(where)
    if current is None:
        return None, f"{where} is not visible here"
    if f.dir is not None and current != f.dir:
        return None, f"{where} here is not the directory the attachment was recorded in (a private mount namespace?)"
    if not view.sees_mounts_of(f, where):
        return None, (f"this process runs in another mount namespace, whose {where} does not receive the namespaces "
                      "mounted where the attachment was recorded")
    if now is None:
        return DEAD, f"its netns {f.netns} is gone"
    return DEAD, f"its netns path {f.netns} holds another namespace"


def _link_evidence(f: Facts, view: View, path: str | None = None) -> tuple[str | None, str]:
    """What the veth recorded says; `path`: what the netns path said (a veth still there beside a path that
    holds another namespace is noted for a recreate's STATUS to wait for: _note_lingering)."""
    link, why = _veth_evidence(f, view)
    if link == LIVE and path == DEAD and view.recreate_wait > 0:
        _note_lingering(f, view)
    return link, why


def _veth_evidence(f: Facts, view: View) -> tuple[str | None, str]:
    if f.veth is None:
        return None, "no veth recorded"
    if f.host_netns is None or f.host_netns != view.host.netns:
        return None, "this process runs in another network namespace than the attachment's host"
    try:
        index = probes.link_index(f.veth)
    except probes.Unseen as exc:
        return None, str(exc)
    if index == f.veth_index:
        return LIVE, f"its veth {f.veth} is there"
    return DEAD, f"its veth {f.veth} is gone" if index is None else f"{f.veth} is another link now"


class Lingering:
    """The veth of a life whose path holds another namespace, made lately: what a recreate's STATUS waits for
    (await_lingering), until `until` (time.monotonic())."""

    __slots__ = ("index", "name", "ns", "until")

    def __init__(self, name: str, index: int, ns: NetnsId | None, until: float) -> None:
        self.name, self.index, self.ns, self.until = name, index, ns, until


def _note_lingering(f: Facts, view: View) -> None:
    """A life whose path holds another namespace now, made less than `view.recreate_wait` seconds ago, while
    the veth recorded is still there: noted, to be waited for until then (never more than the wait: a clock
    set back makes the namespace look younger)."""
    try:
        now = probes.netns_id(f.netns)
    except probes.Unseen:
        return
    if now is None or now.ctime is None or f.veth is None or f.veth_index is None:
        return
    start = time.monotonic()
    until = start + min(view.recreate_wait, now.ctime / 1e9 + view.recreate_wait - time.time())
    if until > start and all(seen.name != f.veth for seen in view.lingering):
        view.lingering.append(Lingering(f.veth, f.veth_index, f.ns, until))


def await_lingering(view: View) -> bool:
    """Wait, holding no lock, for the veths `view` noted (STATUS, before a recreate's ADD): until the first of
    them goes (True: a sweep then finds its life dead) or each one's time is over (False). None is waited for
    whose namespace a thread is still in (it goes only when the thread leaves), when every thread could be
    looked at."""
    waiting = _worth_waiting(view.lingering)
    if waiting:
        log.info("waiting for the veth of a namespace replaced at its path", veths=[w.name for w in waiting],
                 seconds=round(max(w.until for w in waiting) - time.monotonic(), 3))
    pause = 0.002
    while waiting:
        for w in waiting:
            try:
                if probes.link_index(w.name) != w.index:
                    return True
            except probes.Unseen:  # a look that fails is no going: not looked at again
                w.until = 0.0
        now = time.monotonic()
        waiting = [w for w in waiting if w.until > now]
        if waiting:
            time.sleep(min(pause, min(w.until for w in waiting) - now))
            pause = min(pause * 2, 0.05)
    return False


def _worth_waiting(noted: list[Lingering]) -> list[Lingering]:
    """The noted veths but those whose namespace a thread is in (all of them when a thread could not be seen)."""
    if not any(w.ns is not None for w in noted):
        return list(noted)
    from cni_reaper.reap.netns import Occupancy

    inside = Occupancy(threads_only=True)
    if inside.unseen() is not None:
        return list(noted)
    return [w for w in noted if w.ns is None or inside.process_in((w.ns.dev, w.ns.ino)) is None]


class Observed:
    """What the host says now of one life (judge/life.LifeFacts), looked at only when the judge asks: the
    netns path, then, only when the path shows no life, the veth."""

    __slots__ = ("_path", "_veth", "f", "view")

    def __init__(self, f: Facts, view: View) -> None:
        self.f, self.view = f, view
        self._path: Sign | None = None
        self._veth: Sign | None = None

    @property
    def blind(self) -> str | None:
        h = self.view.host
        return h.problem if h.boot is None or h.nsfs is None else None

    @property
    def other_machine(self) -> bool:
        h, f = self.view.host, self.f
        return bool(f.boot is not None and f.machine and h.machine and f.machine != h.machine)

    @property
    def rebooted(self) -> bool:
        h, f = self.view.host, self.f
        return f.boot is not None and h.boot is not None and probes.same_boot(f.boot, h.boot) is False

    @property
    def path(self) -> Sign:
        if self._path is None:
            self._path = Sign(*_path_evidence(self.f, self.view))
        return self._path

    @property
    def veth(self) -> Sign:
        if self._veth is None:
            self._veth = Sign(*_link_evidence(self.f, self.view, self.path.state))
        return self._veth


def judge_life(f: Facts, view: View) -> tuple[str, str]:
    """LIVE, DEAD or UNKNOWN, and why (judge/life.decide_life on what the host says now)."""
    v = decide_life(Observed(f, view))
    return v.state, v.why


def live_at_path(quick: QuickView, view: View) -> set[str]:
    """Of the entries the index can judge quickly (Index.quick_view: flat lists by host as read, entries saved
    since by host, the names whose flat lists are void), the names of those that are LIVE by judge_life's
    first rule: in this boot, on this machine, the path holds the very namespace recorded, seen with one
    stat each (relative to its directory; the last component not followed). The others are judged in full.
    A verb's sweep looks at every live attachment of the node: a thousand on a busy client."""
    h = view.host
    if h.boot is None or h.nsfs is None:
        return set()
    live: set[str] = set()
    for g in quick.groups:
        if _this_host(g.boot, g.machine, h):
            live.update(probes.holding_group(g.names, g.dirs, g.bases, g.ints, g.digest))
    live -= quick.void  # what they hold now is in `saved`, or they are judged in full
    for s in quick.saved:
        if _this_host(s.boot, s.machine, h):
            live.update(probes.holding_flat(s.names, s.paths, s.ints))
    return live


def _this_host(boot: str | None, machine: str, h: probes.Host) -> bool:
    """Recorded in this boot of this machine (a machine id not known on either side: the boot decides)."""
    return boot == h.boot and (not machine or not h.machine or machine == h.machine)


def out_of_reach(f: Facts, view: View) -> str | None:
    """Why this process cannot clean a dead life's leftovers (None: it can): its rules are in the network
    namespace it was recorded in, and this process runs in another one (in the same boot)."""
    if (f.host_netns is not None and f.boot is not None and view.host.boot is not None
            and probes.same_boot(f.boot, view.host.boot) is not False and f.host_netns != view.host.netns):
        return "this process runs in another network namespace than the attachment's host (its rules are there)"
    return None


def held_now(left: bool | float, view: View, now: float | None = None) -> bool:
    """Whether a held mark's retry time (record.left_mark) has not come yet, as this view looks. A time
    further off than the longest wait (a clock stepped back since it was written, a damaged mark) has come."""
    if left is True or left is False or view.at_once:
        return False
    t = now if now is not None else time.time()
    return t < left <= t + HELD_MAX_SECONDS


class Deleted:
    """What a tombstone says to the judge (judge/life.Deleted), as plain values: whether libcni dropped the
    cache entry it had when DEL ran (`done`: it had one, `cached`, and has none now; `cached_now` is asked only
    then: whether it has one, None when the cache cannot be seen), and whether the DEL is long over. The judge
    asks `done` first of every tombstone it decides, so it is looked at once, here."""

    __slots__ = ("cached", "done", "over")

    def __init__(self, deleted_at: float, cached: bool | None, cached_now: Callable[[], bool | None],
                 now: float | None = None) -> None:
        self.cached = cached
        self.done = cached is True and cached_now() is False
        self.over = (now or time.time()) - deleted_at > TOMBSTONE_GRACE_SECONDS


class RecordObserved:
    """What the host and a record (or its index entry) say of an attachment (judge/life.RecordFacts)."""

    __slots__ = ("deleted", "f", "far", "held_due", "left", "life", "mark_why", "unjudged", "word")

    def __init__(self, f: Facts, view: View, mark: bool | float, mark_why: str = "", deleted: Deleted | None = None,
                 word: Verdict | None = None, now: float | None = None, unjudged: str | None = None) -> None:
        self.f, self.life, self.word, self.deleted, self.unjudged = f, Observed(f, view), word, deleted, unjudged
        self.held_due = None if isinstance(mark, bool) else not held_now(mark, view, now)
        self.left = (mark_why or "left for the runtime's DEL or GC") if mark is True else None
        self.mark_why = mark_why or "held: looked at again later"
        self.far = out_of_reach(f, view)


def judge_attachment(f: Facts, view: View, mark: bool | float, mark_why: str = "", deleted: Deleted | None = None,
                     word: Verdict | None = None, now: float | None = None, unjudged: str | None = None) -> Verdict:
    """The one judgement of a recorded attachment (judge/life.decide_record), a record's or an index entry's."""
    return decide_record(RecordObserved(f, view, mark, mark_why, deleted, word, now, unjudged))


class CachedObserved:
    """What the host says now of one life libcni caches (cache.Cached; judge/life.CachedFacts)."""

    __slots__ = ("e", "view")

    def __init__(self, e: Any, view: View) -> None:
        self.e, self.view = e, view

    @property
    def veth_there(self) -> str | None:
        return None if all(probes.veth_gone(name) for name in self.e.veths) else ", ".join(self.e.veths)

    @property
    def path(self) -> Sign:
        e = self.e
        if not e.netns.startswith("/"):
            return Sign(None, f"its cache entry {e.name} names no netns")
        state, why = _path_evidence(Facts(e.netns, None, None, None, None), self.view)
        return Sign(state, why if state else f"{why} (no record of this boot verifies it)")


def judge_cached(entries: list[Any], view: View) -> tuple[str, str]:
    """An attachment with no record, by libcni's cache entries of it (cache.Cached): judge/life.decide_cached."""
    v = decide_cached([CachedObserved(e, view) for e in entries])
    return v.state, v.why
