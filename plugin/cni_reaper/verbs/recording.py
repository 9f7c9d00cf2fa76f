"""What ADD and an adopting CHECK record of the attachment they serve: its addresses (from prevResult), its
port mappings, and the evidence that will tell this life from any other later (reap/probes.py): the
namespace behind CNI_NETNS and its directory, the host, the host side of the veth pair, and where host-local
reserved each address (the configured ipamDataDir first, then host-local's default and Nomad 1.9.4+'s)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.cni.shell import Invocation
    from cni_reaper.state.record import Life
    from cni_reaper.values import HostPort

from cni_reaper import log
from cni_reaper.cni.conf import DEFAULT_IPAM_DIRS
from cni_reaper.cni.result import host_veths, recorded_ips
from cni_reaper.reap import probes
from cni_reaper.state import record


def reservation_dirs(conf: Any) -> list[str]:
    return list(dict.fromkeys([conf.ipamDataDir, *DEFAULT_IPAM_DIRS]))


def current_life(inv: Invocation) -> Life:
    conf = inv.conf
    dirs = reservation_dirs(conf)
    ips = [record.RecordedIP(a.address, a.prefix, a.family,
                             probes.find_reservation(dirs, conf.name, a.address, inv.container_id, inv.ifname))
           for a in recorded_ips(conf.prevResult, inv.version)]
    observed = probes.observe_life(inv.netns, host_veths(conf.prevResult))
    ports = [record.RecordedPortMapping(p.hostPort, p.containerPort, p.protocol, p.hostIP) for p in conf.portMappings]
    warnings: list[str] = []
    life = record.life(observed, ips, ports, warnings)
    for w in warnings:
        log.warn("recorded in part", problem=w)
    return life


def host_ports(conf: Any) -> set[HostPort]:
    """The host ports the runtime gave this attachment (its portMappings)."""
    from cni_reaper.values import HostPort

    return {HostPort(p.protocol, p.hostPort, p.hostIP) for p in conf.portMappings}

