"""Never block an allocation (issue: compatibility), through go-cni with the real reference plugins (1.1.1 and
1.9.x), on both iptables flavours and on a host that mixes them: every request shape real Nomad clients send
is served, and a dead allocation leaves nothing whatever shape it was added with."""

from __future__ import annotations

import json

import pytest

from testkit.sandbox import Stack, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns


def without_capability(sb):
    data = json.loads(sb.shipped().read_text())
    for plugin in data["plugins"]:
        if plugin["type"] == "cni-reaper":
            del plugin["capabilities"]
    path = sb.root / "no-capability.conflist"
    path.write_text(json.dumps(data))
    return sb.conflist(path)


@pytest.mark.parametrize("shape", ["null", "empty", "omit", "capability-undeclared"])
def test_an_allocation_without_ports_in_every_shape_nomad_sends(sandbox, shape):
    """Nomad 1.7 and earlier send "portMappings": null, 1.8 and later [], other runtimes nothing; an operator
    may have left the capability out of cni-reaper's entry. ADD, CHECK and DEL succeed, and once the netns
    is gone its DEL leaves nothing."""
    conflist = without_capability(sandbox) if shape == "capability-undeclared" else sandbox.conflist()
    ports_shape = "empty" if shape == "capability-undeclared" else shape
    network = json.loads(conflist.read_text())["name"]
    cid = unique("alloc-")
    netns = sandbox.container()
    ips = ips_of(sandbox.driver("add", cid, netns, conflist=conflist, ports_shape=ports_shape))
    record = sandbox.record(cid)
    assert record["current"]["portMappings"] == [] and [i["address"] for i in record["current"]["ips"]] == ips
    check = sandbox.driver("check", cid, netns, conflist=conflist, ports_shape=ports_shape)
    assert check.returncode == 0, check.stderr
    live = sandbox.driver("del", cid, netns, conflist=conflist, ports_shape=ports_shape)
    assert live.returncode == 0, live.stderr
    assert sandbox.residue(network, cid, ips) == []

    cid = unique("alloc-")
    netns = sandbox.container()
    ips = ips_of(sandbox.driver("add", cid, netns, conflist=conflist, ports_shape=ports_shape))
    sandbox.remove_container(netns)
    gone = sandbox.driver("del", cid, netns, conflist=conflist, ports_shape=ports_shape)
    assert gone.returncode == 0, gone.stderr
    assert sandbox.residue(network, cid, ips) == []
    if shape == "capability-undeclared":
        assert "portMappings capability" in sandbox.log_file.read_text()


@pytest.mark.parametrize("stack", [Stack("1.1.1"), Stack("1.9")], ids=lambda s: s.id)
def test_without_the_capability_a_dead_allocations_dnat_still_goes(tmp_path, flavour, package_exe, stack):
    """cni-reaper records no ports without the capability, yet the DNAT chain and jumps portmap made for a
    dead allocation are removed: they are found by their owner tag."""
    with open_sandbox(tmp_path, flavour, package_exe, stack) as sb:
        conflist = without_capability(sb)
        cid = unique("alloc-")
        netns = sb.container()
        ips = ips_of(sb.driver("add", cid, netns, ("8080:80/tcp", "8080:80/udp"), conflist))
        assert sb.record(cid)["current"]["portMappings"] == []
        assert [l for l in sb.residue("nomad-reaper", cid, ips) if "CNI-DN-" in l]
        sb.remove_container(netns)
        # the allocation died with its client: no DEL; the next allocation's ADD sweeps
        ips_of(sb.driver("add", unique("alloc-"), sb.container(), ("9090:90/tcp",), conflist))
        assert sb.residue("nomad-reaper", cid, ips) == []


@pytest.mark.parametrize("stack", [Stack("1.1.1"), Stack("1.9")], ids=lambda s: s.id)
def test_a_host_with_legacy_iptables_and_nft_ip6tables(tmp_path, package_exe, stack):
    """Debian keeps iptables and ip6tables as separate alternatives: switching only iptables to legacy leaves
    IPv6 on nft, and the plugins follow each tool. A dead dual-stack allocation's DEL leaves nothing in any
    of the four tables; a live allocation beside it is byte-identical."""
    with open_sandbox(tmp_path, "mixed", package_exe, stack) as sb:
        conflist = sb.conflist(sb.shipped("nomad-reaper-dualstack.conflist"))
        live, dead = unique("alloc-"), unique("alloc-")
        live_ns, dead_ns = sb.container(), sb.container()
        live_ips = ips_of(sb.driver("add", live, live_ns, ("8080:80/tcp", "8080:80/udp"), conflist))
        dead_ips = ips_of(sb.driver("add", dead, dead_ns, ("8081:80/tcp", "8081:80/udp"), conflist))
        assert len(dead_ips) == 2

        tables = {(tool, fl): sb.run([f"{tool}-{fl}-save"], check=True).stdout
                  for tool in ("iptables", "ip6tables") for fl in ("legacy", "nft")}
        v4, v6 = [ip for ip in dead_ips if ":" not in ip], [ip for ip in dead_ips if ":" in ip]
        assert f"-s {v4[0]}/32" in tables["iptables", "legacy"] and v4[0] not in tables["iptables", "nft"]
        assert f"-s {v6[0]}/128" in tables["ip6tables", "nft"] and v6[0] not in tables["ip6tables", "legacy"]
        live_rules = sb.residue("nomad-reaper-ds", live, live_ips)

        sb.remove_container(dead_ns)
        proc = sb.driver("del", dead, dead_ns, ("8081:80/tcp", "8081:80/udp"), conflist)
        assert proc.returncode == 0, proc.stderr
        assert "ipv4: python-iptables, ipv6: iptables-nft-restore" in proc.stderr
        for (tool, fl) in tables:
            text = sb.run([f"{tool}-{fl}-save"], check=True).stdout
            assert dead not in text and not any(f" {ip}/" in text or f"{ip}:" in text for ip in dead_ips), (tool, fl)
        assert sb.residue("nomad-reaper-ds", dead, dead_ips) == []
        assert sb.residue("nomad-reaper-ds", live, live_ips) == live_rules
