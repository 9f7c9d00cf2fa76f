"""Holders nobody can see (docs/how-it-works.md, "Evidence": what may still be forming), found by red-teaming the sweep:

- an IPAM that keeps no reservations (static): a dead attachment's address may be held by an ADD in flight,
  or by an attachment of a network without cni-reaper, and a new life of the same container may be being
  made with the same tags and address; no reservation can show it, so a sweep removes nothing tied to the
  address and none of the container's chains (the runtime's own DEL and GC still do);
- a DEL that cleaned up all it was to clean leaves a tombstone that needs no second look (a second look
  could only find the same container's next life);
- a runtime in a mount namespace that is a slave of the host's (`ip netns exec`, a systemd unit with
  PrivateTmp or ProtectSystem), where iproute2 makes the netns directory a shared mount of its own: its netns
  mounts never reach the host, so from the host its attachments cannot be judged by their path (a chain
  without a veth, macvlan here, has no other evidence), and are left as unknown.

Through go-cni 1.1.7 with the reference plugins 1.1.1 and go-cni 1.1.13 with 1.9, both iptables flavours."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from testkit.sandbox import Held, add_stall_plugin, ips_of, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
ADDR = "172.26.64.50"


def cli(sb, *args):
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(sb.root / "no-conflists")])


def static_conflist(sb, **kw):
    """The shipped network with static IPAM: every attachment gets ADDR, and no reservation file exists."""
    data = json.loads(sb.shipped().read_text())
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["ipam"] = {"type": "static", "addresses": [{"address": f"{ADDR}/20", "gateway": "172.26.64.1"}],
                         "routes": [{"dst": "0.0.0.0/0"}]}
    path = sb.root / f"static-src-{len(kw)}.conflist"
    path.write_text(json.dumps(data))
    return sb.conflist(path, **kw)


def forward(sb) -> list[str]:
    return sorted(l for l in sb.tables().splitlines() if l.startswith("-A CNI-FORWARD") and f"{ADDR}/32" in l)


def test_a_sweep_during_an_add_in_flight_with_static_ipam_keeps_its_rules(sb):
    conflist, stall = add_stall_plugin(sb, static_conflist(sb))
    dead, ns_dead = unique("alloc-"), sb.container()
    assert ips_of(sb.driver("add", dead, ns_dead, ("9000:80/tcp",), conflist)) == [ADDR]
    sb.remove_container(ns_dead)  # died without a DEL
    live, ns_live = unique("alloc-"), sb.container()
    held = Held(sb, conflist, stall, live, ns_live, ("8000:80/tcp",))
    held.wait()  # bridge, firewall and portmap have run for `live` with ADDR; cni-reaper not yet
    before = forward(sb)
    assert before
    out = cli(sb, "sweep", "--apply", "--log-file", str(sb.log_file))
    assert held.release().returncode == 0
    assert forward(sb) == before, out.stdout + out.stderr
    assert "no host-local reservation" in sb.log_file.read_text()  # the reason is said
    assert sb.reach(ns_live, "172.26.64.1", 8000, "in flight") == "in flight"


def test_a_dead_static_attachment_keeps_the_rules_of_a_network_without_cni_reaper(sb):
    conflist = static_conflist(sb)
    plain = static_conflist(sb, without_reaper=True, name="plain", bridge="plain0")
    dead, ns_dead = unique("alloc-"), sb.container()
    assert ips_of(sb.driver("add", dead, ns_dead, ("9000:80/tcp",), conflist)) == [ADDR]
    sb.remove_container(ns_dead)
    assert ips_of(sb.driver("add", unique("alloc-"), sb.container(), ("8000:80/tcp",), plain)) == [ADDR]
    before = forward(sb)
    out = cli(sb, "sweep", "--apply")
    assert forward(sb) == before, out.stdout + out.stderr


@pytest.mark.parametrize("ipam", ["static", "host-local"])
def test_a_re_add_in_flight_after_a_finished_del_keeps_its_rules(sb, ipam):
    """DEL of C with its netns gone (cni-reaper removes what bridge will skip), then C added again in a new
    netns, held before cni-reaper: a sweep then removes nothing of the new life; once recorded it is live."""
    conflist, stall = add_stall_plugin(sb, static_conflist(sb) if ipam == "static" else sb.conflist())
    cid, ns1 = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, ns1, ("8000:80/tcp",), conflist))
    sb.remove_container(ns1)
    assert sb.driver("del", cid, ns1, ("8000:80/tcp",), conflist).returncode == 0
    assert sb.residue(NET, cid, ips) == []
    rec = sb.record(cid)  # with STATUS before the DEL (go-cni 1.1.13), its sweep may have dropped it already
    assert rec is None or rec["deleted"]["verify"] is False, rec  # nothing left for a second look
    ns2 = sb.container()
    held = Held(sb, conflist, stall, cid, ns2, ("8000:80/tcp",))
    held.wait()
    made = sb.residue(NET, cid, [ADDR, *ips, "172.26.64.3"])
    assert made
    out = cli(sb, "sweep", "--apply")
    assert sb.residue(NET, cid, [ADDR, *ips, "172.26.64.3"]) == made, out.stdout + out.stderr
    assert held.release().returncode == 0
    assert sb.reach(ns2, "172.26.64.1", 8000, "second life") == "second life"


def test_what_a_sweep_leaves_of_a_static_attachment_waits_for_the_runtimes_del(sb):
    """A sweep leaves a dead static attachment's rules (no reservation shows they are not someone else's), and
    its record stays, marked: `list` says so, and no later sweep looks at it again. The runtime's DEL of the
    attachment then removes them."""
    conflist = static_conflist(sb)
    cid, netns = unique("alloc-"), sb.container()
    assert ips_of(sb.driver("add", cid, netns, ("9000:80/tcp",), conflist)) == [ADDR]
    sb.remove_container(netns)
    before = sb.residue(NET, cid, [ADDR])
    assert cli(sb, "sweep", "--apply").returncode == 0
    assert sb.residue(NET, cid, [ADDR]) == before
    [item] = json.loads(cli(sb, "list", "--json").stdout)
    assert item["state"] == "dead (left for the runtime's DEL or GC)" and "reservation" in item["why"], item
    again = cli(sb, "sweep")
    assert again.returncode == 0 and again.stdout.startswith("0 item(s)"), again.stdout  # nothing stale
    assert sb.driver("del", cid, netns, ("9000:80/tcp",), conflist).returncode == 0
    assert sb.residue(NET, cid, [ADDR]) == []


def _macvlan_conflist(sb, master: str):
    data = json.loads(sb.shipped().read_text())
    for i, p in enumerate(data["plugins"]):
        if p["type"] == "bridge":
            data["plugins"][i] = {"type": "macvlan", "master": master, "mode": "bridge", "ipam": p["ipam"]}
    path = sb.root / "macvlan-src.conflist"
    path.write_text(json.dumps(data))
    return sb.conflist(path)


@pytest.mark.parametrize("sweeper", ["cli", "status"])
@pytest.mark.parametrize("kind", ["bridge", "macvlan"])
def test_a_runtime_in_a_slave_mount_namespace_keeps_its_live_attachments(sb, kind, sweeper):
    """The runtime in a slave of the host's mount namespace runs `ip netns add` (iproute2 makes /run/netns a
    shared mount there: `shared:M master:N`) and ADDs; from the host (the CLI, or another network's STATUS)
    its netns path looks empty. bridge: its veth proves it live; macvlan (no veth): unknown, left alone."""
    master = unique("mv")[:12]
    sb.run(["sh", "-c", f"ip link add {master} type veth peer name {master}p && ip link set {master} up"], check=True)
    conflist = sb.conflist() if kind == "bridge" else _macvlan_conflist(sb, master)
    name = unique("hid")
    path, cid, out = f"/var/run/netns/{name}", unique("alloc-"), sb.root / "add.out"
    drv = [sb.driver_bin, "-conflist", str(conflist), "-plugindir", f"{sb.plugin_dir}:{sb.plugins}", "-op", "add",
           "-id", cid, "-netns", path, "-ports", "omit", "-port", "8000:80/tcp"]
    script = f'ip netns add {name} && "$@" > {out} 2>&1; echo rc=$? >> {out}; touch {out}.done; exec sleep 600'
    runtime = sb.popen(["unshare", "-m", "--propagation", "slave", "sh", "-c", script, "sh", *drv], quiet=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{out}.done") and time.monotonic() < deadline:
            time.sleep(0.05)
        text = out.read_text()
        assert "rc=0" in text, text
        ips = [ip["address"].split("/")[0] for ip in json.loads(text.split("rc=")[0])[-1]["ips"]]
        before = sb.residue(NET, cid, ips)
        assert any(l.startswith("reservation") for l in before), before
        if sweeper == "cli":
            swept = cli(sb, "sweep", "--apply")
            assert swept.returncode in (0, 6), swept.stdout + swept.stderr
        else:  # a call of the runtime in the host's mount namespace, e.g. Nomad 1.9.5+'s STATUS
            swept = sb.run([str(sb.plugin_dir / "cni-reaper")], input=json.dumps(sb.status_conf()),
                           env={"CNI_COMMAND": "STATUS", "CNI_PATH": str(sb.plugin_dir)})
            assert swept.returncode == 0, swept.stdout + swept.stderr
        assert sb.residue(NET, cid, ips) == before, swept.stdout + swept.stderr
    finally:
        subprocess.run(["pkill", "-P", str(runtime.pid)], check=False)  # the children of what we started only
        runtime.kill()
        runtime.wait()
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        if os.path.exists(path):
            os.unlink(path)
