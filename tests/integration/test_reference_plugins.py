"""What the reference plugins do without cni-reaper, measured with the same stacks as the rest of the suite.
These are the facts cni-reaper's design and the README rest on (docs/compatibility.md); if a new plugin
release changes one, this file says which."""

from __future__ import annotations

import shlex

import pytest

from testkit.sandbox import Stack, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
PLUGIN_SETS = [Stack("1.1.1"), Stack("1.9"), Stack("1.9", "go-cni-1.1.13")]
PORTS = ("8080:80/tcp", "8080:80/udp")


@pytest.fixture(params=PLUGIN_SETS, ids=lambda s: s.id)
def plain(request, tmp_path, flavour, package_exe):
    """A sandbox and the shipped chain without cni-reaper."""
    with open_sandbox(tmp_path, flavour, package_exe, request.param) as sb:
        yield sb, sb.conflist(without_reaper=True)


def test_netns_gone_then_del_succeeds_but_leaks_the_masquerade_rules(plain):
    sb, conflist = plain
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    sb.remove_container(netns)
    assert sb.driver("del", cid, netns, PORTS, conflist).returncode == 0
    left = sb.residue("nomad-reaper", cid, ips)
    assert any(l.startswith("-A POSTROUTING") for l in left) and not any("CNI-DN-" in l for l in left)


def test_del_with_a_live_netns_fails_when_the_masquerade_chain_is_missing(plain):
    """Why cni-reaper leaves a masquerade chain alone while the DEL's netns is a live namespace: bridge's
    DEL (1.1.1 and 1.9.x alike) then deletes the jump with `-j <chain>`, which iptables refuses for a chain
    that does not exist, and the whole chain's DEL fails."""
    sb, conflist = plain
    cid, netns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    [jump] = [l for l in sb.save(4, "nat").splitlines() if l.startswith("-A POSTROUTING") and cid in l]
    chain = shlex.split(jump)[-1]
    tool = str(sb.bin_dir / "iptables")
    sb.run([tool, "-t", "nat", "-D", *shlex.split(jump)[1:]], check=True)
    sb.run([tool, "-t", "nat", "-F", chain], check=True)
    sb.run([tool, "-t", "nat", "-X", chain], check=True)
    proc = sb.driver("del", cid, netns, PORTS, conflist)
    # nft: "Chain '...' does not exist"; legacy: "Couldn't load target `...'"
    assert proc.returncode != 0 and f"-j {chain}" in proc.stderr, proc.stderr
    assert "does not exist" in proc.stderr or "Couldn't load target" in proc.stderr, proc.stderr


def test_check_with_port_mappings_on_an_ipv4_only_network(plain):
    """portmap 1.1.1's CHECK looks for an IPv6 DNAT chain when port mappings are passed, and fails without
    one: Nomad (which sends CHECK on client restart) then recreates the allocation's network. 1.9.x passes."""
    sb, conflist = plain
    cid, netns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    check = sb.driver("check", cid, netns, PORTS, conflist)
    if sb.stack.plugins == "1.1.1":
        assert check.returncode != 0 and "could not check ipv6 dnat" in check.stderr
    else:
        assert check.returncode == 0, check.stderr


def test_gc_removes_nothing(plain):
    """No reference plugin implements GC (1.9.x: `/* FIXME GC */`); a GC listing no valid attachment leaves
    every rule and reservation where it was. libcni 1.3's GCNetworkList DELs what it has cached, so the
    leak is one it has no entry for: the masquerade rules of a DEL whose netns was gone."""
    sb, conflist = plain
    if sb.stack.runtime != "go-cni-1.1.13":
        pytest.skip("libcni 1.1.2 has no GC")
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    sb.remove_container(netns)
    assert sb.driver("del", cid, netns, PORTS, conflist).returncode == 0
    left = sb.residue("nomad-reaper", cid, ips)
    assert left
    gc = sb.driver("gc", conflist=conflist)
    assert gc.returncode == 0, gc.stderr
    assert sb.residue("nomad-reaper", cid, ips) == left


def test_native_masquerade_makes_every_live_del_fail_on_a_host_with_iptables(tmp_path, flavour, package_exe):
    """bridge 1.9.x with `ipMasqBackend: nftables`: the DEL of a live attachment tears down both backends, and
    the iptables one deletes a jump to a chain that was never made; iptables refuses, and the whole chain's
    DEL fails (its native rules are gone by then). cni-reaper cannot help (it runs first on DEL); the
    tombstone it leaves is cleaned once the netns is gone."""
    with open_sandbox(tmp_path, flavour, package_exe, Stack("1.9")) as sb:
        conflist = sb.native_conflist(without_reaper=True)
        cid, netns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", cid, netns, PORTS, conflist))
        proc = sb.driver("del", cid, netns, PORTS, conflist)
        assert proc.returncode != 0 and 'plugin type="bridge" failed (delete)' in proc.stderr, proc.stderr
        assert not [r for r in sb.native_rules() if cid in r]
