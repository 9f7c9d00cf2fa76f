"""The wrapped DEL, whose own part runs before the real portmap's when something of the attachment must go
first, else beside it. A shell interposer stands between the wrapper and the real portmap (the first
`portmap` on the path that is not cni-reaper): it snapshots the nat table, the records and libcni's cache as
portmap's DEL starts, and can be told to sleep or fail. (From a red team of that change.)"""

from __future__ import annotations

import fcntl
import json
import time

import pytest

from testkit.nomad import Client
from testkit.sandbox import STACKS, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NET = "nomad"
PORTS = ("8080:80/tcp",)


def _interpose(sb, client):
    d = sb.root / "interpose"
    d.mkdir(exist_ok=True)
    snap = sb.root / "snap"
    snap.mkdir(exist_ok=True)
    script = f"""#!/bin/sh
if [ "$CNI_COMMAND" = DEL ]; then
  "{sb.bin_dir}/iptables-save" -t nat > "{snap}/nat-at-portmap-del"
  cat /var/lib/cni/reaper/r-*.json > "{snap}/records-at-portmap-del" 2>/dev/null
  ls /var/lib/cni/results > "{snap}/cache-at-portmap-del" 2>/dev/null
  [ -f "{sb.root}/ctl-sleep" ] && sleep "$(cat "{sb.root}/ctl-sleep")"
  if [ -f "{sb.root}/ctl-fail" ]; then
    cat >/dev/null
    echo '{{"cniVersion":"0.4.0","code":999,"msg":"interposer says no"}}'
    exit 1
  fi
fi
exec "{sb.plugins}/portmap" "$@"
"""
    (d / "portmap").write_text(script)
    (d / "portmap").chmod(0o755)
    sb.plugin_path = f"{client.wrap}:{d}:{sb.plugin_dir}:{sb.plugins}"
    return snap


@pytest.fixture
def wrapped(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, STACKS[0]) as sb:
        yield sb


def _dnat_chain(cid):
    import hashlib

    return ("CNI-DN-" + hashlib.sha512((NET + cid).encode()).hexdigest())[:28]



def _allocated(wrapped):
    """The sandbox, the wrapping client with the interposer in place, and one allocation it added."""
    sb = wrapped
    client = Client(sb)
    snap = _interpose(sb, client)
    cid, netns = unique("alloc-"), sb.container()
    return sb, client, snap, cid, netns, ips_of(client.driver("add", cid, netns, PORTS))

def test_netns_gone_del_cleans_before_the_real_portmap(wrapped):
    sb, client, snap, cid, netns, ips = _allocated(wrapped)
    assert _dnat_chain(cid) in sb.save(table="nat")
    sb.remove_container(netns)
    out = client.driver("del", cid, netns, PORTS)
    assert out.returncode == 0, out.stderr
    at_start = (snap / "nat-at-portmap-del").read_text()
    assert _dnat_chain(cid) not in at_start, "cni-reaper's DEL did not run before portmap's (netns gone)"
    assert sb.residue(NET, cid, ips) == []


def test_a_deferred_del_records_the_cache_entry_and_the_tombstone(wrapped):
    sb, client, _, cid, netns, ips = _allocated(wrapped)
    out = client.driver("del", cid, netns, PORTS)
    assert out.returncode == 0, out.stderr
    rec = sb.record(cid)
    assert rec is not None and rec["deleted"] is not None, rec
    assert rec["deleted"]["cached"] is True, rec["deleted"]
    assert sb.residue(NET, cid, ips) == []
    # repeated DELs (Nomad retries), netns alive then gone: all succeed, nothing left
    assert client.driver("del", cid, netns, PORTS).returncode == 0
    sb.remove_container(netns)
    assert client.driver("del", cid, netns, PORTS).returncode == 0
    assert client.driver("add", unique("alloc-"), sb.container(), ("8081:80/tcp",)).returncode == 0
    assert sb.record(cid) is None
    assert sb.residue(NET, cid, ips) == []


def test_the_real_portmap_failing_during_the_deferred_part_is_the_answer(wrapped):
    sb, client, _, cid, netns, ips = _allocated(wrapped)
    (sb.root / "ctl-fail").write_text("1")
    (sb.root / "ctl-sleep").write_text("0.5")
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": "eth0",
           "CNI_PATH": sb.plugin_path}
    conf = {"cniVersion": "0.4.0", "name": NET, "type": "portmap", "snat": True,
            "capabilities": {"portMappings": True},
            "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}}
    wrapped_out = sb.run([str(client.wrap / "portmap")], env=env, input=json.dumps(conf))
    assert wrapped_out.returncode == 1 and "interposer says no" in wrapped_out.stdout, wrapped_out
    assert json.loads(wrapped_out.stdout)["code"] == 999
    (sb.root / "ctl-fail").unlink()
    (sb.root / "ctl-sleep").unlink()
    assert client.driver("del", cid, netns, PORTS).returncode == 0
    assert sb.residue(NET, cid, ips) == []


def test_the_state_lock_held_during_the_deferred_part(wrapped):
    sb = wrapped
    client = Client(sb, settings={"wrapTimeout": 1, "lockTimeout": 30})
    _interpose(sb, client)
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(client.driver("add", cid, netns, PORTS))
    lock = open(sb.state_dir() / ".lock", "a")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        out = client.driver("del", cid, netns, PORTS)
        took = time.monotonic() - started
    finally:
        lock.close()
    assert out.returncode == 0, out.stderr
    assert took < 8, took  # a hang detector (wrapTimeout 1 s against a lock never free), not a figure
    assert [l for l in sb.residue(NET, cid, ips) if not l.startswith("reservation")] == []
    assert sb.residue(NET, cid, ips) == []
    sb.remove_container(netns)
    assert client.driver("add", unique("alloc-"), sb.container(), ("8081:80/tcp",)).returncode == 0
    assert sb.record(cid) is None, sb.record(cid)
    assert "wrapTimeout" in sb.log_file.read_text()
