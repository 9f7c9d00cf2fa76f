"""cni-reaper in the shipped Nomad conflist, driven by containerd's go-cni (the library Nomad uses) with the
Debian reference plugins, on both iptables flavours, with the installed package and the built binary."""

from __future__ import annotations

import json
import os

import pytest

from testkit.sandbox import unique

pytestmark = pytest.mark.netns


def test_add_records_attachment_with_netns_identity_ips_and_ports(sandbox):
    netns = sandbox.container()
    cid = unique("alloc-")
    proc = sandbox.driver("add", cid, netns, ports=("8080:80/tcp", "8080:80/udp"),
                          args=("IgnoreUnknown=true", "NOMAD_JOB_ID=web"))
    assert proc.returncode == 0, proc.stderr
    record = sandbox.record(cid)
    assert record is not None
    st = os.stat(netns)
    assert record["schema"] == 2 and record["network"] == "nomad-reaper" and record["ifname"] == "eth0"
    cur = record["current"]
    assert cur["netns"] == netns
    # what tells this life from any later one at the same path: the pinned nsfs inode's change time too
    assert cur["netnsId"] == {"dev": st.st_dev, "ino": st.st_ino, "ctime": st.st_ctime_ns}
    d = os.stat(os.path.dirname(netns))
    assert cur["netnsDir"]["dev"] == d.st_dev and cur["netnsDir"]["ino"] == d.st_ino
    assert cur["netnsDir"]["groups"]  # /run/netns is shared (iproute2 makes it so): its peer group
    host_ns = sandbox.run(["stat", "-L", "-c", "%i", "/proc/self/ns/net"], check=True).stdout.strip()
    # the boot id the sandbox's processes read, from a file mounted over /proc's: recorded with that view
    boot = sandbox.run(["cat", "/proc/sys/kernel/random/boot_id"], check=True).stdout.strip()
    assert cur["host"]["boot"] == boot + "@bound" and cur["host"]["netns"] == int(host_ns)
    # the host side of the veth pair, as bridge's result names it, with its index in the host netns
    veth = [i["name"] for i in json.loads(proc.stdout)[-1]["interfaces"] if i["name"].startswith("veth")]
    assert cur["veth"]["name"] == veth[0]
    [link] = json.loads(sandbox.run(["ip", "-j", "link", "show", veth[0]], check=True).stdout)
    assert cur["veth"]["ifindex"] == link["ifindex"]
    [ip] = cur["ips"]
    assert ip["family"] == 4 and ip["prefix"] == 20 and ip["address"].startswith("172.26.")
    # where host-local reserved it, and that file's identity
    res = sandbox.cni_dir / "networks" / "nomad-reaper" / ip["address"]
    rst = os.stat(res)
    assert ip["reservation"] == {"dataDir": "/var/lib/cni/networks", "dev": ip["reservation"]["dev"],
                                 "ino": rst.st_ino, "mtime": rst.st_mtime_ns, "ctime": rst.st_ctime_ns}
    assert record["settings"] == {"ipamDataDir": "/var/lib/cni/networks", "cniCacheDir": "/var/lib/cni",
                                  "backend": "auto"}
    assert {(p["hostPort"], p["containerPort"], p["protocol"]) for p in record["current"]["portMappings"]} == {
        (8080, 80, "tcp"), (8080, 80, "udp")}
    assert record["cniArgs"].get("NOMAD_JOB_ID") == "web"
    assert record["deleted"] is None
    # the chain really ran: the masquerade jump for that IP is in the sandbox's nat table
    assert f"-s {ip['address']}/32" in sandbox.save(table="nat")


def test_del_after_netns_gone_leaves_tombstone_and_succeeds(sandbox):
    netns = sandbox.container()
    cid = unique("alloc-")
    assert sandbox.driver("add", cid, netns, ports=("8081:80/tcp",)).returncode == 0
    sandbox.remove_container(netns)
    proc = sandbox.driver("del", cid, netns, ports=("8081:80/tcp",))
    assert proc.returncode == 0, proc.stderr
    record = sandbox.record(cid)
    if sandbox.stack.cni_version == "1.1.0":
        # Nomad 1.9.5+ sent STATUS before the DEL: its sweep already removed the dead attachment
        assert record is None and sandbox.residue("nomad-reaper", cid, []) == []
    else:
        assert record["deleted"] is not None and record["deleted"]["netnsGone"] is True
    # twice is fine too
    assert sandbox.driver("del", cid, netns).returncode == 0


def test_check_adopts_a_missing_record(sandbox):
    netns = sandbox.container()
    cid = unique("alloc-")
    assert sandbox.driver("add", cid, netns).returncode == 0
    for p in sandbox.state_dir().glob("r-*.json"):
        p.unlink()
    proc = sandbox.driver("check", cid, netns)
    assert proc.returncode == 0, proc.stderr
    record = sandbox.record(cid)
    assert record is not None and record["current"]["netnsId"]["ino"] == os.stat(netns).st_ino
