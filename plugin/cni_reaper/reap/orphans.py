"""What cni-reaper never recorded, found by the plugins' own tags: the attachments tagged in the nat tables of
both families and in the plugins' native nftables tables (leaks from before cni-reaper was installed, or of a
network that does not chain it), and the targets they give:

- for the CLI (`sweep --orphans`) and the periodic sweep: those that libcni's cache proves dead
  (evidence.judge_cached), and those it has no entry of that host-local proves dead: under its locks, no
  reservation of their network names them (claims.Claims.unreserved_doubt; an ADD in flight holds one
  before any rule of it is made), where the network's conflist says host-local keeps it;
- for an ADD that maps host ports (`shadowing`): the attachments without a record whose DNAT maps the same
  host ports, judged the same way (host-local's directory being the one the ADD's own address was
  reserved in);
- for GC: those the runtime's valid list does not name (the runtime's word), and host-local reservations
  of the network whose holder it does not name.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cni_reaper.reap.evidence import View
    from cni_reaper.reap.holders import HostPort, Mapping, PortMap
    from cni_reaper.reap.hostlocal import Keeping
    from cni_reaper.reap.outcome import Outcome
    from cni_reaper.reap.targets import Target

from cni_reaper import log
from cni_reaper.judge import DEAD, UNKNOWN
from cni_reaper.judge.reservations import NONE_BY_TIME, bound
from cni_reaper.reap import cache
from cni_reaper.reap.evidence import judge_cached

UNNAMED = ""  # the network of an attachment known only by portmap's native rules, which name none


def tagged(backend: str) -> dict[tuple[str, str], set[str]]:
    """(network, container ID) of every attachment tagged in the nat tables of both families and in the
    plugins' native tables, with the source addresses of its masquerade rules and the addresses its native
    hostport rules name (network UNNAMED when only those name it)."""
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.iptables.plan import tagged_networks
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend
    from cni_reaper.reap.netfilter.nftables.plan import hostport_owners, tagged_natively
    from cni_reaper.reap.netfilter.select import backend_of

    found: dict[tuple[str, str], set[str]] = {}
    rules = NftBackend().read()
    for owner, addresses in tagged_natively(rules).items():
        found.setdefault(owner, set()).update(addresses)
    for family in (4, 6):
        try:
            b = backend_of(backend, family)
        except BackendError:
            if family == 4:
                raise
            continue  # no ip6tables: no IPv6 rules
        for owner, addresses in tagged_networks(b.read(family)).items():
            found.setdefault(owner, set()).update(addresses)
    _add_hostport_owners(found, hostport_owners(rules))
    return found


def _add_hostport_owners(found: dict[tuple[str, str], set[str]], owners: dict[str, set[str]]) -> None:
    """portmap's native rules name no network: each address they map to goes with the one network whose tags
    of the container name it, else with none (UNNAMED)."""
    for cid, addresses in owners.items():
        for ip in addresses:
            nets = [n for (n, c), tagged_ips in found.items() if c == cid and n != UNNAMED and ip in tagged_ips]
            found.setdefault((nets[0] if len(nets) == 1 else UNNAMED, cid), set()).add(ip)


def _tags(backend: str) -> dict[tuple[str, str], set[str]] | None:
    from cni_reaper.reap.netfilter.interface import BackendError

    try:
        return tagged(backend)
    except BackendError as exc:
        log.warn("the tables could not be read; orphans not searched", error=str(exc))
        return None


def proven_dead(conf: Any, recorded: dict[tuple[str, str], set[str]], view: View, only_network: str | None = None,
                keeping: Keeping | None = None) -> list[Target]:
    """Tagged attachments with no record that libcni's cache (conf.cniCacheDir) proves dead, or, with no cache
    entry, that host-local may prove dead under its locks (`keeping`: where host-local keeps `only_network`, as
    its conflist says; None or no data dir when not known: then they are unknown); and of recorded ones
    (`recorded`: (network, container ID) -> the addresses of its lives), the tagged rules of addresses no
    recorded life has (unrecorded_sources)."""
    found = _tags(conf.backend)
    if found is None:
        return []
    from cni_reaper.reap.hostlocal import Keeping

    keeping = keeping or Keeping()
    reserved_in = keeping.data_dir
    out = []
    for (tagged_as, cid), addresses in sorted(found.items()):
        network = named(tagged_as, cid, addresses, only_network or "", keeping, view, conf.cniCacheDir)
        if not network or (only_network and network != only_network):
            continue
        if (network, cid) in recorded:
            t = unrecorded_sources(conf, network, cid, addresses - recorded[(network, cid)], reserved_in)
        else:
            t = judged(conf, network, cid, addresses, view, reserved_in if network == only_network else "")
        if t is not None:
            out.append(t)
    return out


def unrecorded_sources(conf: Any, network: str, cid: str, addresses: set[str], reserved_in: str) -> Target | None:
    """A recorded attachment's tagged rules of addresses none of its recorded lives has (a life from before
    cni-reaper was installed: its masquerade jump from an address since released, which makes bridge's DEL
    of the chain fail): a target of those addresses alone. The claims remove them only where host-local
    governs the address and no life of the container holds it, a life in flight included (no reservation is
    its own, and its chains stay); the container's own record keeps everything else."""
    from cni_reaper.reap.targets import Expect, Target

    if not addresses or not reserved_in:
        return None
    expect = {ip: Expect(reserved_in, (cid, ""), not_after=NONE_BY_TIME) for ip in addresses}  # none is its own
    return Target(network, cid, "", frozenset(addresses), whole=False, parts=frozenset({"masq"}), expect=expect,
                  backend=conf.backend, cache_dir=conf.cniCacheDir)


def named(network: str, cid: str, addresses: set[str], own: str, keeping: Keeping, view: View, cache_dir: str) -> str:
    """The network of a tagged attachment: its tags' own; for one only portmap's native rules name, `own`
    (the network swept, kept by host-local as `keeping` says) when every address those rules send to lies in
    its subnets and on the host's interface of that subnet alone (no other network inside, beside or around
    it: probes.on_link), and neither a reservation in another network nor libcni's cache entry of another
    network names the container (else "": not known, noted). A network of static IPAM or with a data
    directory of its own keeps no reservation where this looks: the subnets and the interfaces they are on
    are what tells its rules from the swept network's."""
    if network != UNNAMED:
        return network
    from cni_reaper.cni.conf import DEFAULT_IPAM_DIRS
    from cni_reaper.reap.hostlocal import reserved_elsewhere
    from cni_reaper.reap.probes import on_link

    if not (own and keeping.data_dir and keeping.covers(addresses)):
        view.note("native hostport rules whose network cannot be told (their addresses are outside the swept "
                  "network's subnets, or its host-local is not known)")
        return ""
    if not keeping.covers(addresses, on_link() or []):
        view.note("native hostport rules whose network cannot be told (their addresses are not on the swept "
                  "network's interface alone: another network's subnet holds them too)")
        return ""
    cached = cache.Results(cache_dir).of_container(cid)
    if cached is None or any(e.network != own for e in cached):
        view.note("native hostport rules whose network cannot be told (libcni caches their container on another "
                  "network, or its cache cannot be read)")
        return ""
    if reserved_elsewhere([keeping.data_dir, *DEFAULT_IPAM_DIRS], cid, own):
        view.note("native hostport rules whose network cannot be told (a reservation names their container elsewhere)")
        return ""
    return own


def judged(conf: Any, network: str, cid: str, addresses: set[str], view: View, reserved_in: str) -> Target | None:
    """The target of one attachment known by its tags alone, when libcni's cache proves it dead, or when it has
    no cache entry and host-local keeps its network in `reserved_in` (the clean-up then asks host-local, under
    its locks: claims.Claims.unreserved_doubt); None otherwise, the reason noted in the view."""
    from cni_reaper.reap.targets import Expect, Target

    entries = cache.entries(conf.cniCacheDir, network, cid)
    if entries is None:
        view.note(cache.view(conf.cniCacheDir) or f"libcni's cache in {conf.cniCacheDir} cannot be read")
        return None
    if not entries and reserved_in:
        expect = {ip: Expect(reserved_in, (cid, "")) for ip in addresses}
        return Target(network, cid, "", frozenset(addresses), whole=True, any_source=True, expect=expect,
                      backend=conf.backend, cache_dir=conf.cniCacheDir, reserved_in=reserved_in)
    state, why = judge_cached(entries, view)
    if state != DEAD:
        if state == UNKNOWN:
            view.note(f"tagged attachments without a record: {why}")
        return None
    import time

    expect, now = {}, time.time_ns()
    oldest = min(e.mtime for e in entries)
    for ip in addresses:
        expect[ip] = Expect(conf.ipamDataDir, (cid, ""), not_after=bound(oldest, now))
    for e in entries:
        for ip in e.ips:
            expect[ip] = Expect(conf.ipamDataDir, (cid, e.ifname), not_after=bound(e.mtime, now))
    return Target(network, cid, "", frozenset(expect), whole=True, any_source=True, expect=expect,
                  backend=conf.backend, cache_dir=conf.cniCacheDir)


def cached_dead(conf: Any, recorded: set[tuple[str, str]], view: View) -> list[Target]:
    """The attachments of conf's network that libcni caches, that have no record and that their cache entries
    prove dead (evidence.judge_cached): a target of their cached addresses' reservations alone. Its clean-up
    makes libcni's cached results forget those addresses, so that a late DEL of them hands the firewall plugin
    no address that a new allocation holds: a boot that emptied host-local's directory gives their addresses
    again with no release anyone saw. No reservation goes here (none is taken for theirs: a reservation
    naming the container may be a re-ADD of it in flight, and the entry's time says nothing of it when the
    clock moved); one left from before the boot, and their rules, are the orphan sweep's."""
    from cni_reaper.reap.targets import Expect, Target

    of_container: dict[str, list[cache.Cached]] = {}
    for e in cache.Results(conf.cniCacheDir).of_network(conf.name):
        of_container.setdefault(e.container_id, []).append(e)
    out = []
    for cid, entries in sorted(of_container.items()):
        if not cid or (conf.name, cid) in recorded or not any(e.ips for e in entries):
            continue
        if judge_cached(entries, view)[0] != DEAD:
            continue
        expect = {ip: Expect(conf.ipamDataDir, (cid, e.ifname), not_after=NONE_BY_TIME) for e in entries for ip in e.ips}
        out.append(Target(conf.name, cid, "", frozenset(expect), whole=False, parts=frozenset({"reservation"}),
                          expect=expect, backend=conf.backend, cache_dir=conf.cniCacheDir))
    return out


def not_valid(conf: Any, recorded: set[tuple[str, str]], valid: Callable[[str], bool]) -> list[Target]:
    """GC: tagged attachments of conf's network with no record whose container the runtime does not name."""
    from cni_reaper.reap.targets import Expect, Target

    found = _tags(conf.backend) or {}
    out = []
    for (network, cid), addresses in sorted(found.items()):
        if network != conf.name or (network, cid) in recorded or valid(cid):
            continue
        expect = {ip: Expect(conf.ipamDataDir, (cid, "")) for ip in addresses}
        out.append(Target(network, cid, "", frozenset(addresses), whole=True, any_source=True, expect=expect,
                          backend=conf.backend, cache_dir=conf.cniCacheDir, by_runtime=True))
    return out


def unheld_reservations(conf: Any, still_used: Callable[[str, str], bool]) -> list[Target]:
    """GC: reservations of conf's network whose holder `still_used(containerID, ifname)` does not claim."""
    from cni_reaper.reap.hostlocal import NetworkDir
    from cni_reaper.reap.targets import Expect, Target

    d = NetworkDir(conf.ipamDataDir, conf.name)
    try:
        held = d.all()
    finally:
        d.close()
    return [Target(conf.name, r.owner[0], r.owner[1], frozenset({r.ip}), whole=True,
                   parts=frozenset({"reservation", "conntrack"}),
                   expect={r.ip: Expect(conf.ipamDataDir, r.owner, r.ident)}, backend=conf.backend,
                   cache_dir=conf.cniCacheDir, by_runtime=True)
            for r in held if not still_used(*r.owner)]


class Shadows:
    """What else maps the host ports an ADD was just given: `clashes` (holders.Mapping: another container's
    DNAT of the same port and protocol), and `targets`, those of them with no record that libcni's cache or
    host-local may prove dead (an owner with a record is the sweep's, judged by its record)."""

    __slots__ = ("clashes", "targets")

    def __init__(self) -> None:
        self.clashes: list[Mapping] = []
        self.targets: list[Target] = []


def shadowing(conf: Any, cid: str, ports: set[HostPort], families: set[int], recorded: Callable[[], set[tuple[str, str]]],
              keeping: Keeping, view: View) -> Shadows:
    """The DNAT of other containers that maps one of `ports` (the ADD's, of container `cid`): one read of the
    hostport chains of its backend's `families` and of the native hostport tables. The conflict is a reason to
    look, never proof: each owner is judged as any attachment is (its record, libcni's cache, host-local,
    as `keeping` says: where the ADD's own address was reserved and its subnets; no data dir: none)."""
    from cni_reaper.reap.holders import mapped_now

    out = Shadows()
    if not ports:
        return out
    pm = mapped_now(conf.backend, families)
    for why in pm.blind:
        log.warn("who else maps this allocation's host ports cannot be read", error=why)
    out.clashes = [m for p in sorted(ports, key=str) for m in pm.others(p, cid)]
    if not out.clashes:
        return out
    out.targets = _owners_judged(conf, out.clashes, recorded(), keeping, view)
    return out


def _owners_judged(conf: Any, clashes: list[Mapping], known: set[tuple[str, str]], keeping: Keeping,
                   view: View) -> list[Target]:
    """The targets of the clashing owners that have no record and that libcni's cache or host-local may prove
    dead (an owner with a record is judged by its record; one whose network cannot be told is left)."""
    tags = _tags(conf.backend) or {}
    out = []
    for other in sorted({m.container_id for m in clashes if m.container_id}):
        tagged_as = _tagged_as(other, clashes, tags)
        if tagged_as is None:
            view.note(f"the DNAT of {other} is tagged in more than one network: which one maps the port is not known")
            continue
        addresses = tags.get((tagged_as, other), set())
        network = named(tagged_as, other, addresses, conf.name, keeping, view, conf.cniCacheDir)
        if not network or (network, other) in known:
            continue
        t = judged(conf, network, other, addresses, view, keeping.data_dir if network == conf.name else "")
        if t is not None:
            out.append(t)
    return out


def _tagged_as(cid: str, clashes: list[Mapping], tags: dict[tuple[str, str], set[str]]) -> str | None:
    """The network the clashing DNAT of `cid` is tagged in: its iptables rules' own, or for native rules the
    one tagged() put their addresses with (UNNAMED: none); None when more than one."""
    nets = {m.network for m in clashes if m.container_id == cid and m.network}
    if not nets:
        nets = {n for (n, c) in tags if c == cid}
        nets = {UNNAMED} if UNNAMED in nets or not nets else nets
    return next(iter(nets)) if len(nets) == 1 else None


def report(shadows: Shadows, outcome: Outcome | None, cid: str,
           look_again: Callable[[], PortMap] | None = None) -> None:
    """Say, per clash, whether the other owner's DNAT went (the port is this allocation's now) or stays (its
    owner is live or not known dead: connections to the port may reach it). Before saying it stays, the
    tables are read again (`look_again`, once): another sweep (a look of another ADD, the timer) may have
    removed it since this look read them, and then the port is free."""
    gone = {k.owner for k in outcome.removed} if outcome is not None else set()
    would = {k.owner for k in outcome.would} if outcome is not None else set()
    now: list[PortMap] = []
    for m in shadows.clashes:
        if _owned(m, gone):
            log.info("host port freed: the DNAT of a dead allocation shadowed it", port=str(m.port),
                     freedFrom=m.container_id, forContainer=cid)
        elif _owned(m, would):
            log.warn("host port shadowed by the DNAT of a dead allocation, left in place: its network is in observe "
                     "mode", port=str(m.port), mappedBy=m.container_id, network=m.network, forContainer=cid)
        elif look_again is not None and _gone_since(m, now, look_again):
            log.info("host port freed: the DNAT that shadowed it is gone (another sweep removed it)",
                     port=str(m.port), freedFrom=m.container_id, forContainer=cid)
        else:
            log.warn("host port also mapped by another allocation, live or not known dead: its DNAT stays and may "
                     "take this allocation's connections", port=str(m.port), mappedBy=m.container_id or "(untagged)",
                     network=m.network, forContainer=cid,
                     fix="stop the other allocation, or run `cni-reaper sweep --orphans` to see what is known of it")


def _owned(m: Mapping, owners: set[tuple[str, str]]) -> bool:
    """Whether mapping `m` is of one of `owners` ((network, container ID); a mapping that names no network is
    of its container's in any)."""
    return any(c == m.container_id and (not m.network or n == m.network) for n, c in owners)


def _gone_since(m: Mapping, now: list[PortMap], look_again: Callable[[], PortMap]) -> bool:
    """Whether mapping `m` is no longer in the tables (read again once, kept in `now`; unreadable: not gone)."""
    if not now:
        try:
            now.append(look_again())
        except Exception:  # noqa: BLE001 - a second look that fails leaves the warning as it was
            from cni_reaper.reap.holders import PortMap

            now.append(PortMap())
            now[0].blind.append("the tables could not be read again")  # not asked again for the next clash
    return not now[0].blind and m not in now[0].mapped
