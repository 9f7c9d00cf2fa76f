"""Native leaks from before installation (issue 43, item 4; plugins 1.9 on their nftables backends): an
allocation whose DEL came without port mappings keeps its DNAT in `cni_hostport` (its comment: the bare
container ID); that DEL also fails in bridge while the netns is still there, and the runtime then removes
the namespace. Once cni-reaper is installed, the first allocation on that host port gets its traffic."""

from __future__ import annotations

import pytest

from testkit.sandbox import Stack, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
PORTS = ("8080:80/tcp", "8080:80/udp")


@pytest.fixture(params=[Stack("1.9", "go-cni-1.1.13"), Stack("1.9")], ids=lambda s: s.id)
def sb(request, tmp_path, flavour, reaper_exe):
    """The installed package and the built bundle (the release's: what runs on a client) alike."""
    with open_sandbox(tmp_path, flavour, reaper_exe, request.param) as sandbox:
        yield sandbox


def test_a_native_dnat_left_by_a_del_without_port_mappings_no_longer_shadows_the_port(sb):
    before = sb.native_conflist(without_reaper=True)
    dead, dead_ns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", dead, dead_ns, PORTS, before))
    sb.driver("del", dead, dead_ns, (), before)  # no port mappings: portmap removes nothing (bridge may fail too)
    sb.remove_container(dead_ns)
    assert [r for r in sb.native_rules() if dead in r and "dnat" in r]
    live, live_ns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", live, live_ns, PORTS, sb.native_conflist()))
    assert sb.reach(live_ns, "172.26.64.1", 8080, "live") == "live"
    assert not [r for r in sb.native_rules() if dead in r and "dnat" in r]
