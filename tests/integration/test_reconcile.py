"""The clean-up, end to end: the shipped conflists through go-cni with the real reference plugins, on
iptables-nft and iptables-legacy, IPv4 and dual-stack, in throwaway namespaces."""

from __future__ import annotations

import json

import pytest

from testkit.sandbox import ips_of, unique

pytestmark = pytest.mark.netns
DUALSTACK = "nomad-reaper-dualstack.conflist"
PORTS = ("8080:80/tcp", "8080:80/udp")


def status(sb, conflist):
    """A STATUS from the runtime side: the cheapest verb that sweeps."""
    conf = json.loads(conflist.read_text())
    reaper = next(p for p in conf["plugins"] if p["type"] == "cni-reaper")
    rc, out, err = sb.plugin("STATUS", dict(reaper, cniVersion="1.1.0", name=conf["name"]), cid="", netns="",
                             ifname="")
    assert rc == 0, (out, err)


@pytest.mark.parametrize("variant", ["ipv4", "dualstack"])
def test_6385_restart_sequence_leaves_nothing_and_the_final_del_succeeds(sandbox, variant):
    """ADD A; A's netns vanishes while the client is down; the client re-adds A (host-local refuses), DELs,
    ADDs again; the job stops. Without cni-reaper the final DEL fails and A's old masquerade rules stay."""
    conflist = sandbox.conflist(sandbox.shipped(DUALSTACK)) if variant == "dualstack" else sandbox.conflist()
    network = json.loads(conflist.read_text())["name"]
    cid = unique("alloc-")
    first = sandbox.container()
    old_ips = ips_of(sandbox.driver("add", cid, first, PORTS, conflist))
    assert len(old_ips) == (2 if variant == "dualstack" else 1)
    sandbox.remove_container(first)

    second = sandbox.container()
    readd = sandbox.driver("add", cid, second, PORTS, conflist)
    if sandbox.stack.cni_version == "1.1.0":
        # Nomad 1.9.5+ sends STATUS first: cni-reaper's sweep has released the dead life's reservation
        assert readd.returncode == 0, readd.stderr
    else:
        assert readd.returncode != 0 and "duplicate allocation" in readd.stderr
    assert sandbox.driver("del", cid, second, PORTS, conflist).returncode == 0
    new_ips = ips_of(sandbox.driver("add", cid, second, PORTS, conflist))
    for ip in old_ips:
        if ip not in new_ips:
            assert not [l for l in sandbox.residue(network, cid, [ip]) if f"{ip}/" in l], "old life's rules left"

    final = sandbox.driver("del", cid, second, PORTS, conflist)
    assert final.returncode == 0, final.stderr
    sandbox.remove_container(second)
    status(sandbox, conflist)
    assert sandbox.residue(network, cid, old_ips + new_ips) == []
    assert sandbox.record(cid) is None


@pytest.mark.parametrize("variant", ["ipv4", "dualstack", "custom-network"])
def test_del_with_netns_gone_removes_everything_at_once(sandbox, variant):
    shipped = {"dualstack": DUALSTACK, "custom-network": "custom-network.conflist"}
    conflist = sandbox.conflist(sandbox.shipped(shipped[variant])) if variant in shipped else sandbox.conflist()
    network = json.loads(conflist.read_text())["name"]
    cid = unique("alloc-")
    netns = sandbox.container()
    ips = ips_of(sandbox.driver("add", cid, netns, PORTS, conflist))
    assert sandbox.residue(network, cid, ips)  # the chain made its rules
    sandbox.remove_container(netns)
    proc = sandbox.driver("del", cid, netns, PORTS, conflist)
    assert proc.returncode == 0, proc.stderr
    assert sandbox.residue(network, cid, ips) == []
    # libcni hands the plugin's stderr (its JSON log lines) to the runtime: the legacy tables were changed
    # in process through libiptc, the nft ones with one iptables-nft-restore transaction
    backend = "python-iptables" if sandbox.flavour == "legacy" else "iptables-nft-restore"
    lines = [json.loads(l) for l in proc.stderr.splitlines() if l.startswith("{")]
    assert any(l.get("msg") == "removed" and l.get("backend") == backend for l in lines), proc.stderr


def test_del_without_port_mappings_removes_the_dnat_chain_and_jumps(sandbox):
    cid = unique("alloc-")
    netns = sandbox.container()
    ips = ips_of(sandbox.driver("add", cid, netns, PORTS))
    assert any("CNI-DN-" in l for l in sandbox.residue("nomad-reaper", cid, ips))
    assert sandbox.driver("del", cid, netns).returncode == 0  # no port mappings: portmap returns at once
    assert not [l for l in sandbox.residue("nomad-reaper", cid, ips) if "CNI-DN-" in l or "dnat" in l]
    sandbox.remove_container(netns)
    status(sandbox, sandbox.conflist())
    assert sandbox.residue("nomad-reaper", cid, ips) == []


def test_host_port_reuse_reaches_the_new_allocation(sandbox):
    """Nomad #11901: a dead allocation's DNAT jump for port P stands first; the new allocation on P must get
    the traffic. A real TCP connection from the host netns to the host port proves it."""
    dead = unique("alloc-")
    netns_a = sandbox.container()
    ips_of(sandbox.driver("add", dead, netns_a, PORTS))
    sandbox.remove_container(netns_a)  # the client lost it: no DEL ever comes
    live = unique("alloc-")
    netns_b = sandbox.container()
    ips_of(sandbox.driver("add", live, netns_b, PORTS))
    assert not [l for l in sandbox.residue("nomad-reaper", dead, []) if "dnat" in l or "CNI-DN-" in l]
    assert sandbox.reach(netns_b, "172.26.64.1", 8080, "B") == "B"


def test_reboot_with_restored_rules_first_add_cleans_them(sandbox):
    """Nomad #18842: after a reboot every netns is gone but the saved rules are restored."""
    before = {}
    for port in ("8080", "8081"):
        cid = unique("alloc-")
        before[cid] = ips_of(sandbox.driver("add", cid, sandbox.container(), (f"{port}:80/tcp", f"{port}:80/udp")))
    sandbox.reboot()
    assert all(sandbox.residue("nomad-reaper", cid, ips) for cid, ips in before.items())
    cid = unique("alloc-")
    netns = sandbox.container()
    ips_of(sandbox.driver("add", cid, netns, PORTS))
    for old, ips in before.items():
        assert sandbox.residue("nomad-reaper", old, ips) == [], old
    assert sandbox.reach(netns, "172.26.64.1", 8080, "after-reboot") == "after-reboot"


def test_two_networks_each_clean_only_their_own(sandbox):
    ours = sandbox.conflist()
    other = sandbox.conflist(name="other-net", bridge="othbr0", subnet="10.77.0.0/24")
    a, o = unique("alloc-"), unique("alloc-")
    netns_a, netns_o = sandbox.container(), sandbox.container()
    ips_a = ips_of(sandbox.driver("add", a, netns_a, PORTS, ours))
    ips_o = ips_of(sandbox.driver("add", o, netns_o, ("9090:90/tcp",), other))
    other_rules = sandbox.residue("other-net", o, ips_o)
    assert other_rules
    sandbox.remove_container(netns_a)
    assert sandbox.driver("del", a, netns_a, PORTS, ours).returncode == 0
    status(sandbox, other)
    assert sandbox.residue("nomad-reaper", a, ips_a) == []
    assert sandbox.residue("other-net", o, ips_o) == other_rules
    assert sandbox.record(o)["deleted"] is None


LOOKALIKES = {
    "nat": [
        "-N DOCKER",
        "-A DOCKER -i docker0 -j RETURN",
        "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
        "-N CNI-0123456789abcdef01234567",
        "-A CNI-0123456789abcdef01234567 -j MASQUERADE",
        "-A POSTROUTING -s 172.26.64.250/32 -j CNI-0123456789abcdef01234567",
        # a comment that quotes the network and a dead ID inside another string
        '-A POSTROUTING -s 172.26.64.251/32 -m comment --comment "copy of name: \\"nomad-reaper\\" id: \\"{dead}\\" rule" -j MASQUERADE',
    ],
    "filter": [
        "-N DOCKER-USER",
        "-A DOCKER-USER -j RETURN",
        "-A FORWARD -j DOCKER-USER",
        "-A FORWARD -s 10.99.0.0/16 -j ACCEPT",
    ],
}


def _add_lookalikes(sandbox, dead):
    for table, lines in LOOKALIKES.items():
        text = f"*{table}\n" + "\n".join(l.format(dead=dead) for l in lines) + "\nCOMMIT\n"
        sandbox.run([str(sandbox.bin_dir / "iptables-restore"), "--noflush"], input=text, check=True)


def test_live_allocations_other_networks_and_user_rules_are_untouched(sandbox):
    live, dead = unique("alloc-"), unique("alloc-")
    netns_live, netns_dead = sandbox.container(), sandbox.container()
    ips_live = ips_of(sandbox.driver("add", live, netns_live, ("8080:80/tcp",)))
    ips_dead = ips_of(sandbox.driver("add", dead, netns_dead, ("8081:80/tcp",)))
    other = sandbox.conflist(name="other-net", bridge="othbr0", subnet="10.77.0.0/24")
    ips_of(sandbox.driver("add", unique("alloc-"), sandbox.container(), ("9090:90/tcp",), other))
    _add_lookalikes(sandbox, dead)
    dead_lines = set(sandbox.residue("nomad-reaper", dead, ips_dead))
    expected = [l for l in sandbox.tables().splitlines() if l not in dead_lines]
    live_rules = sandbox.residue("nomad-reaper", live, ips_live)

    sandbox.remove_container(netns_dead)
    status(sandbox, sandbox.conflist())
    assert sandbox.residue("nomad-reaper", dead, ips_dead) == []
    assert sandbox.tables().splitlines() == expected
    assert sandbox.residue("nomad-reaper", live, ips_live) == live_rules
    status(sandbox, sandbox.conflist())  # running it again changes nothing
    assert sandbox.tables().splitlines() == expected


def test_a_user_rule_jumping_to_a_dead_chain_keeps_that_chain(sandbox):
    dead = unique("alloc-")
    netns = sandbox.container()
    ips = ips_of(sandbox.driver("add", dead, netns, ()))
    import hashlib

    chain = ("CNI-" + hashlib.sha512(("nomad-reaper" + dead).encode()).hexdigest())[:28]
    sandbox.run([str(sandbox.bin_dir / "iptables"), "-t", "nat", "-A", "POSTROUTING", "-d", "192.0.2.9/32", "-j", chain],
                check=True)
    sandbox.remove_container(netns)
    status(sandbox, sandbox.conflist())
    left = sandbox.residue("nomad-reaper", dead, ips)
    assert f"-A POSTROUTING -d 192.0.2.9/32 -j {chain}" in left  # the user's rule
    assert f":{chain} -" in left  # and the chain it needs
    assert not [l for l in left if "POSTROUTING -s" in l]  # but the attachment's own jump is gone


def test_gc_removes_everything_else_of_the_network_recorded_or_not(sandbox):
    keep, recorded, unrecorded = unique("alloc-"), unique("alloc-"), unique("alloc-")
    netns = {c: sandbox.container() for c in (keep, recorded, unrecorded)}
    ips = {keep: ips_of(sandbox.driver("add", keep, netns[keep], ("8080:80/tcp",))),
           recorded: ips_of(sandbox.driver("add", recorded, netns[recorded], ("8081:80/tcp",))),
           # a leak from before cni-reaper was installed: same network, chain without cni-reaper
           unrecorded: ips_of(sandbox.driver("add", unrecorded, netns[unrecorded], ("8082:80/tcp",),
                                             sandbox.conflist(without_reaper=True)))}
    kept_rules = sandbox.residue("nomad-reaper", keep, ips[keep])
    conf = json.loads(sandbox.conflist().read_text())
    gc = dict(conf["plugins"][-1], cniVersion="1.1.0", name=conf["name"],
              **{"cni.dev/valid-attachments": [{"containerID": keep, "ifname": "eth0"}]})
    rc, out, err = sandbox.plugin("GC", gc, cid="", netns="", ifname="")
    assert rc == 0, (out, err)
    assert sandbox.residue("nomad-reaper", recorded, ips[recorded]) == []
    assert sandbox.residue("nomad-reaper", unrecorded, ips[unrecorded]) == []
    assert sandbox.residue("nomad-reaper", keep, ips[keep]) == kept_rules
    assert [r["containerID"] for r in sandbox.records()] == [keep]
