"""What ADD and an adopting CHECK record of the attachment they serve: its addresses (from prevResult), its
port mappings, and the evidence that will tell this life from any other later (reap/probes.py): the
namespace behind CNI_NETNS and its directory, the host, the host side of the veth pair, and where host-local
reserved each address (the configured ipamDataDir first, then host-local's default and Nomad 1.9.4+'s)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.cni.shell import Invocation
    from cni_reaper.reap.holders import HostPort

from cni_reaper import log
from cni_reaper.cni.conf import DEFAULT_IPAM_DIRS
from cni_reaper.cni.result import host_veths, recorded_ips
from cni_reaper.reap import probes
from cni_reaper.state import record


def reservation_dirs(conf: Any) -> list[str]:
    return list(dict.fromkeys([conf.ipamDataDir, *DEFAULT_IPAM_DIRS]))


def current_life(inv: Invocation) -> dict[str, Any]:
    conf = inv.conf
    ips = recorded_ips(conf.prevResult, inv.version)
    dirs = reservation_dirs(conf)
    for ip in ips:
        ip["reservation"] = probes.find_reservation(dirs, conf.name, ip["address"], inv.container_id, inv.ifname)
    observed = probes.observe_life(inv.netns, host_veths(conf.prevResult))
    warnings: list[str] = []
    life = record.life(inv.netns, observed, ips, [p.as_dict() for p in conf.portMappings], warnings)
    for w in warnings:
        log.warn("recorded in part", problem=w)
    return life


def host_ports(conf: Any) -> set[HostPort]:
    """The host ports the runtime gave this attachment (its portMappings)."""
    from cni_reaper.reap.holders import HostPort

    return {HostPort(p.protocol, p.hostPort, p.hostIP) for p in conf.portMappings}


def settings(conf: Any) -> dict[str, str]:
    return record.settings(conf.ipamDataDir, conf.cniCacheDir, conf.backend)
