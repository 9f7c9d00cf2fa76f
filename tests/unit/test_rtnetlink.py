"""reap/rtnetlink.py (what probes.on_link reads: bridges and every address) agrees with pyroute2, the
reference, in a throwaway network namespace with a bridge, secondary and IPv6 addresses, and a veth. The
release bundle ships no pyroute2: before this reader, on_link found nothing there and native hostport rules'
network could never be told (issue 43, item 4)."""

from __future__ import annotations

import ipaddress
import subprocess

import pytest

from cni_reaper.reap import probes

pytestmark = pytest.mark.usefixtures("private_host")


def _reference() -> set[tuple[int, bool, str]]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        bridges = {link["index"] for link in ipr.get_links()
                   if (info := link.get_attr("IFLA_LINKINFO")) is not None and info.get_attr("IFLA_INFO_KIND") == "bridge"}
        return {(a["index"], a["index"] in bridges, str(ipaddress.ip_network(
            f"{a.get_attr('IFA_LOCAL') or a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}", strict=False)))
            for a in ipr.get_addr()}


def test_on_link_sees_what_pyroute2_sees():
    for cmd in ("ip link set lo up", "ip link add br-t type bridge", "ip link set br-t up",
                "ip addr add 172.30.0.1/16 dev br-t", "ip addr add 172.30.9.1/24 dev br-t",
                "ip addr add fd00:30::1/64 dev br-t nodad", "ip link add v-a type veth peer name v-b",
                "ip addr add 10.9.0.1/30 dev v-a", "ip link set v-a up"):
        subprocess.run(cmd.split(), check=True)
    got = {(o.index, o.bridge, str(o.network)) for o in probes.on_link() or []}
    assert got == _reference()
    assert any(bridge and net == "172.30.9.0/24" for _, bridge, net in got)  # a bridge's secondary address
