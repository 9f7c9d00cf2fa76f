"""What may still belong to a life that is not dead: the other half of the judgement (evidence.py says who is
dead; this says what of a dead life's leftovers someone else may hold), decided under host-local's locks.

Why a reservation is the evidence: bridge asks host-local for an address before it makes any rule (and
portmap and firewall run after bridge), host-local creates each reservation file once (O_EXCL) and never
rewrites it, and while cni-reaper holds host-local's lock of a network no address of it is given or taken.
So under that lock the reservations name every life of that network that has, or may be making, rules:
one that was recorded, and one whose ADD is still in flight (recorded by nobody yet, cached by libcni only
once the whole chain is done). A dead life's own reservation is the very file it recorded (or, for what
cni-reaper 0.2 recorded, a file naming it that is older than the life); any other reservation of its
address, or naming its container, is someone else's: another container's, or a newer life of the same
container with the same tag and perhaps the same address (a recreate, a restore after a reboot).

For a dead life, then:
- its untagged rules of an address (firewall's CNI-FORWARD) and the address's conntrack entries go only when
  no other attachment holds the address (a record that is live, unknown or being deleted) and no
  reservation of it in any network directory is anyone else's;
- its rules tagged with its container and tied to an address (a masquerade jump from it, a DNAT to it, a
  native rule for it) go only when no other life of the same container holds the address;
- its container's chains (the masquerade and DNAT chains, tagged rules of any address) go only when no other
  life of the container is live, unknown, being deleted or reserved;
- its reservation of an address goes only when the file there is its own.
All of that rests on host-local governing the address: the dead life recorded its reservation of it, or
host-local keeps its network in a directory known here. An address no reservation governs (an IPAM that
keeps none: static, dhcp; a data directory cni-reaper is not told of) has holders nobody can see: another
attachment given the same address, a new life of the same container being made with the same tags and
address. Then nothing tied to the address goes, and none of the container's chains, unless the runtime
itself said the attachment is over (its DEL, GC's valid list: `Target.by_runtime`); the reason is said.
Likewise a life whose netns path now holds a newer namespace and that recorded no reservation
(`Target.forming`).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from cni_reaper.reap.hostlocal import NetworkDir, Reservation
    from cni_reaper.reap.targets import Expect, Target
    from cni_reaper.values import Key


def own(t: Target, r: Reservation) -> bool:
    """Whether reservation `r` is the dead life's own (t.expect says what it recorded: judge/reservations.own)."""
    from cni_reaper.judge.reservations import own as judged_own

    e: Expect | None = t.expect.get(r.ip)
    if e is None or r.network != t.network:
        return False
    return judged_own(e.owner, e.ident, e.not_after, r.owner, r.ident)


def canonical(ip: str) -> str:
    """An address as the plugins, host-local and the rules print it (a record written by hand may spell it
    otherwise: `FD00::2`): holders.address's reading, the one every rule's address gets."""
    from cni_reaper.reap.holders import address

    return address(ip) or ip


class Holdings:
    """Who holds what now, the one answer every judge asks (the sweep, GC, orphans and a DEL's own clean-up
    through Claims; undo through `others_than`): the attachments that are live, unknown or being deleted (key
    -> the addresses their lives hold, from the sweep's one judgement: sweep.Selection.holders,
    sweep.holdings), and host-local's reservations in the directories given, read under host-local's locks by
    the caller. `whole`: the networks whose directories are read whole (None: every one); of the others only
    `wanted_ips`."""

    def __init__(self, holders: dict[Key, set[str]], dirs: Iterable[NetworkDir], whole: set[str] | None = None,
                 wanted_ips: Iterable[str] = ()) -> None:
        self.holders = holders
        self.by_ip: dict[str, list[Reservation]] = {}
        self.by_container: dict[tuple[str, str], list[Reservation]] = {}
        self.host_local: set[str] = set()  # the networks host-local keeps in a directory known here
        self.read: dict[str, list[NetworkDir]] = {}  # network -> its directories read whole
        self.unread_ips: set[str] = set()  # addresses whose reservation is there but cannot be read
        self.unread_networks: set[str] = set()  # networks with such a reservation: any container may hold one
        wanted = {canonical(ip) for ip in wanted_ips}
        for d in {id(d): d for d in dirs}.values():
            self._read(d, whole is None or d.network in whole, wanted)
        self.holder_ips: dict[str, set[Key]] = {}
        self.holder_containers: dict[tuple[str, str], set[Key]] = {}
        for k, addresses in holders.items():
            self.holder_containers.setdefault(k.owner, set()).add(k)
            for ip in addresses:
                self.holder_ips.setdefault(canonical(ip), set()).add(k)

    def _read(self, d: NetworkDir, whole: bool, wanted_ips: set[str]) -> None:
        """The reservations of one directory: all of them (`whole`), else those of `wanted_ips`."""
        if d.fd is not None:
            self.host_local.add(d.network)
            if whole:
                self.read.setdefault(d.network, []).append(d)
        for r in d.all() if whole else [r for r in map(d.get, sorted(wanted_ips)) if r]:
            self.by_ip.setdefault(r.ip, []).append(r)
            self.by_container.setdefault((r.network, r.owner[0]), []).append(r)
        self.unread_ips.update(map(canonical, d.unread))  # a reservation that cannot be read may be anyone's
        if d.unread and whole:
            self.unread_networks.add(d.network)

    def holding(self, ip: str) -> set[Key]:
        """The attachments (live, unknown or being deleted) whose lives hold `ip`."""
        return self.holder_ips.get(canonical(ip), set())

    def reserving(self, ip: str) -> list[Reservation]:
        """host-local's reservations of `ip` in the directories read."""
        return self.by_ip.get(canonical(ip), [])

    def unread(self, ip: str) -> bool:
        """Whether something is at `ip`'s reservation's name that cannot be read as one: it may be anyone's."""
        return canonical(ip) in self.unread_ips

    def others_than(self, cid: str) -> Others:
        return Others(self, cid)


class Others:
    """Who else holds an address now than what undo puts back for container `cid` (Holdings.others_than): any
    attachment that is live, unknown or being deleted (a newer life of `cid` among them), a reservation naming
    another container, one that cannot be read; and for a network whose addresses no host-local reservation
    governs here, anyone (`ungoverned`). A reservation naming `cid` is not told from one an undo cut short
    wrote (the same content): the one that finishes it must put back the rest."""

    def __init__(self, holdings: Holdings, cid: str) -> None:
        self.holdings, self.cid = holdings, cid

    def of(self, addresses: Iterable[str]) -> str | None:
        """Why one of `addresses` may not be put back for `cid` (None: no one else holds any)."""
        for ip in sorted({canonical(a) for a in addresses}):
            holders = sorted(self.holdings.holding(ip))
            if holders:
                k = holders[0]
                who = "a newer life of it" if k.container_id == self.cid else f"the attachment {k.container_id}"
                return f"{ip} is held by {who} ({k.network})"
            for r in self.holdings.reserving(ip):
                if r.owner[0] != self.cid:
                    return f"{ip} is held by {r.owner[0]}, whose reservation it is ({r.data_dir}/{r.network})"
            if self.holdings.unread(ip):
                return (f"{ip} has something at its host-local reservation's name that cannot be read as one: who "
                        "holds it is not known")
        return None

    def ungoverned(self, network: str) -> str | None:
        """Why nothing tied to an address of `network` may be put back (None: host-local's reservations show
        its holders): no directory of it was read, so its IPAM keeps no reservation here (static, dhcp, a
        data directory cni-reaper is not told of), and an attachment given the same address is not seen."""
        if network in self.holdings.host_local:
            return None
        return (f"no host-local reservation governs {network}'s addresses here (its IPAM keeps none, or in a data "
                "directory cni-reaper is not told of): who holds them now cannot be seen")


class Claims(Holdings):
    """The claims on a set of targets' leftovers: the holdings, with the directories of the targets' networks
    read whole and of the others the targets' addresses."""

    def __init__(self, targets: Iterable[Target], holders: dict[Key, set[str]],
                 dirs: Iterable[NetworkDir]) -> None:
        targets = list(targets)
        super().__init__(holders, dirs, {t.network for t in targets}, {ip for t in targets for ip in t.dead_ips})
        self.kin: dict[tuple[str, str], list[Target]] = {}  # the targets of each container
        for t in targets:
            self.kin.setdefault((t.network, t.container_id), []).append(t)

    def _held_by_others(self, t: Target, ip: str, kin_only: bool) -> bool:
        holders = self.holding(ip)
        if kin_only:
            holders = {k for k in holders if k.owner == (t.network, t.container_id)}
        return bool(holders - {t.key}) or (not t.whole and t.key in holders)

    def governed(self, t: Target, ip: str) -> bool:
        """Whether host-local's reservations can show every holder of `ip` in t's network: the dead life
        recorded its reservation of it, or host-local keeps t's network in a directory known here (or the
        runtime said the attachment is over)."""
        if t.by_runtime or t.network in self.host_local:
            return True
        e = t.expect.get(ip)
        return e is not None and e.ident is not None

    def _container_governed(self, t: Target) -> bool:
        """Whether host-local's reservations can show every life of t's container: the runtime said it is over,
        host-local proved that none is left (t.reserved_in, when unreserved_doubt found none), or it governs
        one of t's addresses."""
        return t.by_runtime or bool(t.reserved_in) or any(self.governed(t, ip) for ip in t.dead_ips)

    def ip_free(self, t: Target, ip: str) -> bool:
        """No one else holds `ip`: its untagged rules and conntrack entries may go."""
        if t.forming or self.unread(ip) or not self.governed(t, ip) or self._held_by_others(t, ip, kin_only=False):
            return False
        return all(own(t, r) for r in self.reserving(ip))

    def kin_free(self, t: Target, ip: str) -> bool:
        """No other life of t's container holds `ip`: its rules tagged with the container and tied to the
        address may go."""
        if t.forming or self.unread(ip) or not self.governed(t, ip) or self._held_by_others(t, ip, kin_only=True):
            return False
        return all(self._own_by_kin(t, r) for r in self.reserving(ip) if r.owner[0] == t.container_id)

    def _own_by_kin(self, t: Target, r: Reservation) -> bool:
        """`r` is the own reservation of one of the dead lives of t's container cleaned now."""
        return any(own(k, r) for k in self.kin.get((t.network, t.container_id), [t]))

    def container_free(self, t: Target) -> bool:
        """No other life of t's container is live, unknown, being deleted or reserved: its chains may go."""
        if t.forming or t.network in self.unread_networks or not self._container_governed(t):
            return False
        others = self.holder_containers.get((t.network, t.container_id), set()) - {t.key}
        if others or (not t.whole and t.key in self.holders):
            return False
        return all(self._own_by_kin(t, r) for r in self.by_container.get((t.network, t.container_id), []))

    def unreserved_doubt(self, t: Target) -> str | None:
        """Why host-local's word does not prove dead an attachment known by its tags alone (t.reserved_in; None:
        it does). Under host-local's locks no address of the network is given or taken, and bridge asks for
        one before it makes any rule: a container no reservation names, in every directory of its network
        (the one host-local keeps it in, read whole, among them), has no life there that is live or forming."""
        import os

        dirs = self.read.get(t.network, [])
        if not any(os.path.realpath(d.data_dir) == os.path.realpath(t.reserved_in) for d in dirs):
            return (f"host-local's directory of the network ({t.reserved_in}/{t.network}) is not there or cannot be "
                    "opened: nothing shows that no life of it holds an address")
        unread = [f"{d.data_dir}/{d.network}/{name}" for d in dirs for name in d.unread]
        if unread:
            return f"a host-local reservation cannot be read ({unread[0]}): it may name it"
        if self.by_container.get((t.network, t.container_id)):
            return "a host-local reservation names it: a life of it is live or being made"
        return None

    def unexplained(self, t: Target) -> str | None:
        """Why something of t stays that no attachment known here explains (None: nothing): a reservation that
        names its container but is not the one its dead lives recorded (a newer life of it, being made, or its
        own with a changed modification time). Its record must not go with it (judge/reservations.py): it is
        held, and looked at again later."""
        mine = [r for r in self.by_container.get((t.network, t.container_id), []) if not self._own_by_kin(t, r)]
        for r in mine:
            if not self.holding(r.ip) and (r.ip in t.dead_ips or t.whole):  # held by a life known here: explained
                return (f"a host-local reservation of {r.ip} names it ({r.data_dir}/{r.network}) and is not the one "
                        "it recorded: a newer life of it, or a reservation changed since")
        return None

    def releasable(self, t: Target, ip: str) -> list[Reservation]:
        """The dead life's own reservations of `ip` (in its network's directories)."""
        return [r for r in self.reserving(ip) if r.network == t.network and own(t, r)]

    def why_kept(self, t: Target, ip: str) -> str:
        if t.forming:
            return "its netns path holds a newer namespace: a new life may be forming there"
        if self.unread(ip):
            return "its host-local reservation cannot be read: who holds it is not known"
        if not self.governed(t, ip):
            return ("no host-local reservation of it was recorded or is there (its IPAM keeps none): nothing shows "
                    "who else holds it, or whether a new life of the container is being made with it; the "
                    "runtime's DEL or GC removes it")
        return self._why_held(t, ip)

    def unseen(self, t: Target) -> str | None:
        """Why what t left must wait for the runtime's DEL or GC (None: the claims can see every holder)."""
        if t.by_runtime:
            return None
        blind = sorted(ip for ip in t.dead_ips if not self.governed(t, ip))
        if t.forming or blind:
            return self.why_kept(t, blind[0] if blind else "")
        if t.whole and not self._container_governed(t):
            return self.why_chains_kept(t)
        return None

    def why_chains_kept(self, t: Target) -> str:
        if t.network in self.unread_networks:
            return "its chains stay: a host-local reservation of its network cannot be read (it may name it)"
        if t.forming or not self._container_governed(t):
            return ("its chains stay: no host-local reservation shows whether a new life of the container is "
                    "being made (the runtime's DEL or GC removes them)")
        return "its chains stay, another life of it is there"

    def _why_held(self, t: Target, ip: str) -> str:
        others = sorted(self.holding(ip) - {t.key})
        if others:
            return f"held by {others[0].container_id} ({others[0].network})"
        foreign = [r for r in self.reserving(ip) if not own(t, r)]
        return f"reserved by {foreign[0].owner[0]} ({foreign[0].data_dir}/{foreign[0].network})" if foreign else "claimed"
