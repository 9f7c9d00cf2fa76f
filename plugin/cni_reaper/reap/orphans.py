"""What cni-reaper never recorded, found by the plugins' own tags: the attachments tagged in the nat tables of
both families and in the plugins' native nftables tables (leaks from before cni-reaper was installed, or of a
network that does not chain it), and the targets they give:

- for the CLI (`sweep --orphans`) and the periodic sweep: only those that libcni's cache proves dead
  (evidence.judge_cached): an attachment that has no cache entry may be an ADD in flight, or another
  runtime's, and is left, with the reason;
- for GC: those the runtime's valid list does not name (the runtime's word), and host-local reservations
  of the network whose holder it does not name.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cni_reaper.reap.evidence import View
    from cni_reaper.reap.targets import Target

from cni_reaper import log
from cni_reaper.reap import cache
from cni_reaper.reap.evidence import DEAD, UNKNOWN, judge_cached


def tagged(backend: str) -> dict[tuple[str, str], set[str]]:
    """(network, container ID) of every attachment tagged in the nat tables of both families and in the
    plugins' native tables, with the source addresses of its masquerade rules."""
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.iptables.plan import tagged_networks
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend
    from cni_reaper.reap.netfilter.nftables.plan import tagged_natively
    from cni_reaper.reap.netfilter.select import select

    found: dict[tuple[str, str], set[str]] = {}
    for owner, addresses in tagged_natively(NftBackend().read()).items():
        found.setdefault(owner, set()).update(addresses)
    for family in (4, 6):
        try:
            b = select(backend, family)
        except BackendError:
            if family == 4:
                raise
            continue  # no ip6tables: no IPv6 rules
        for owner, addresses in tagged_networks(b.read(family)).items():
            found.setdefault(owner, set()).update(addresses)
    return found


def _tags(backend: str) -> dict[tuple[str, str], set[str]] | None:
    from cni_reaper.reap.netfilter.interface import BackendError

    try:
        return tagged(backend)
    except BackendError as exc:
        log.warn("the tables could not be read; orphans not searched", error=str(exc))
        return None


def proven_dead(conf: Any, recorded: set[tuple[str, str]], view: View, only_network: str | None = None) -> list[Target]:
    """Tagged attachments with no record that libcni's cache (conf.cniCacheDir) proves dead."""
    from cni_reaper.reap.targets import Expect, Target

    found = _tags(conf.backend)
    if found is None:
        return []
    out = []
    for (network, cid), addresses in sorted(found.items()):
        if (only_network and network != only_network) or (network, cid) in recorded:
            continue
        entries = cache.entries(conf.cniCacheDir, network, cid)
        if entries is None:
            view.note(cache.view(conf.cniCacheDir) or f"libcni's cache in {conf.cniCacheDir} cannot be read")
            continue
        state, why = judge_cached(entries, view)
        if state != DEAD:
            if state == UNKNOWN:
                view.note(f"tagged attachments without a record: {why}")
            continue
        expect = {}
        oldest = min(e.mtime for e in entries)
        for ip in addresses:
            expect[ip] = Expect(conf.ipamDataDir, (cid, ""), not_after=oldest)
        for e in entries:
            for ip in e.ips:
                expect[ip] = Expect(conf.ipamDataDir, (cid, e.ifname), not_after=e.mtime)
        out.append(Target(network, cid, "", frozenset(expect), whole=True, any_source=True, expect=expect,
                          backend=conf.backend, cache_dir=conf.cniCacheDir))
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
