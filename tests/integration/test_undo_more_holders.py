"""Undo's holder check (claims.Holdings, Others) from more sides, found by a red team (issue 32): a FIFO at
another network's lock name (undo hung for good: host-local's lock is opened without blocking now), an
address an attachment being made on another network holds, an unreadable IPv6 reservation, the same
container re-added in flight (its newer life's chain: neither the rules nor the jump into its chain come
back), a live record spelling its address otherwise."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from testkit.sandbox import Held, Stack, add_stall_plugin, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NOMAD = Stack("1.9", "go-cni-1.1.13")
NET = "nomad-reaper"


def cli(sb, *args, timeout=120):
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(sb.root / "none")], timeout=timeout)


def one_address(path, v4, subnet, name=None, bridge=None):
    data = json.loads(path.read_text())
    if name:
        data["name"] = name
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["ipam"]["ranges"] = [[{"subnet": subnet, "rangeStart": v4, "rangeEnd": v4}]]
            if bridge:
                p["bridge"] = bridge
    path.write_text(json.dumps(data))
    return path


def sweep(sb):
    out = cli(sb, "sweep", "--apply")
    if out.returncode != 0:
        print("SWEEP-RC", out.returncode, out.stdout, out.stderr)
        out = cli(sb, "sweep", "--apply")
    assert out.returncode == 0, out.stdout + out.stderr


def native(sb):
    return sorted(re.sub(r" # handle \d+", "", l) for l in sb.native_rules())


def test_a_fifo_at_an_unrelated_networks_lock_does_not_hang_undo(tmp_path, flavour, package_exe):
    """Something not host-local's at another network's `lock` name (a FIFO; host-local opens it O_RDWR and
    is not stopped by it): undo of a dead container, which locks every network of every data directory,
    must end in bounded time with a message, not hang."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conf = sb.conflist()
        dead, ns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", dead, ns, ("8080:80/tcp",), conf))
        sb.remove_container(ns)
        sweep(sb)
        junk = sb.cni_dir / "networks" / "other-net"
        junk.mkdir(parents=True)
        os.mkfifo(junk / "lock")
        try:
            out = cli(sb, "undo", dead, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("undo hung on a FIFO at another network's lock name")
        assert "Traceback" not in out.stderr, out.stderr
        assert out.returncode != 0 and "cannot open host-local's lock" in out.stdout + out.stderr, out


def test_undo_refuses_an_address_a_forming_attachment_holds_on_another_network(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        a = one_address(sb.conflist(name="net-a", bridge="rta0"), "10.75.0.7", "10.75.0.0/24")
        b = one_address(sb.conflist(name="net-b", bridge="rtb0"), "10.75.0.7", "10.75.0.0/24")
        dead, ns = unique("alloc-"), sb.container()
        [ip] = ips_of(sb.driver("add", dead, ns, ("8080:80/tcp",), a))
        sb.remove_container(ns)
        sweep(sb)
        stalled, stall_dir = add_stall_plugin(sb, b)
        live, ns_live = unique("alloc-"), sb.container()
        held = Held(sb, stalled, stall_dir, live, ns_live, ("9090:80/tcp",))
        try:
            held.wait()
            before = set(sb.tables().splitlines())
            out = cli(sb, "undo", dead)
            back = sorted(l for l in set(sb.tables().splitlines()) - before if ip in l)
        finally:
            assert held.release().returncode == 0
        assert out.returncode == 4 and back == [], (back, out.stdout)


@pytest.mark.parametrize("what", ["fifo", "symlink", "dir"])
def test_dual_stack_v6_reservation_unreadable(tmp_path, flavour, package_exe, what):
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conf = sb.native_conflist("nomad-reaper-dualstack.conflist")
        dead, ns = unique("alloc-"), sb.container()
        ips = ips_of(sb.driver("add", dead, ns, ("8080:80/tcp",), conf))
        v6 = next(i for i in ips if ":" in i)
        sb.remove_container(ns)
        sweep(sb)
        d = sb.cni_dir / "networks" / "nomad-reaper-ds"
        target = d / v6
        if what == "fifo":
            os.mkfifo(target)
        elif what == "symlink":
            (d / "elsewhere").write_text(f"{dead}\r\neth0")
            target.symlink_to(d / "elsewhere")
        else:
            target.mkdir()
        tb, nb = set(sb.tables().splitlines()), set(native(sb))
        out = cli(sb, "undo", dead, timeout=60)
        back = sorted(l for l in (set(sb.tables().splitlines()) - tb) | (set(native(sb)) - nb) if v6 in l)
        assert out.returncode == 4 and "Traceback" not in out.stderr, out.stdout + out.stderr
        assert back == [], (back, out.stdout)


def test_same_container_re_add_in_flight(tmp_path, flavour, package_exe):
    """The dead life of a container cleaned; the same container ID ADDed again (a restore), held before
    cni-reaper, got the same address and maps another port. Undo of that container ID now: what comes back?"""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conf = one_address(sb.conflist(bridge="rts1"), "10.76.0.7", "10.76.0.0/24")
        cid, ns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", cid, ns, ("8080:80/tcp",), conf))
        sb.remove_container(ns)
        sweep(sb)
        stalled, stall_dir = add_stall_plugin(sb, conf)
        ns2 = sb.container()
        held = Held(sb, stalled, stall_dir, cid, ns2, ("9090:80/tcp",))
        try:
            held.wait()
            before = set(sb.tables().splitlines())
            out = cli(sb, "undo", cid)
            back = sorted(set(sb.tables().splitlines()) - before)
            rec = sb.record(cid)
        finally:
            res = held.release()
        assert res.returncode == 0, res.stderr
        # none of its rules, nor the jump into the newer life's chain; its reservation is not told from one an
        # undo cut short wrote (the same content), so the record may come back: the newer life's ADD replaces it
        assert back == [], (back, rec is not None, out.stdout)
        assert "exists again (a newer life of the container has it)" in out.stdout, out.stdout


def _upper(obj, addr):
    if isinstance(obj, dict):
        return {k: _upper(v, addr) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_upper(v, addr) for v in obj]
    if isinstance(obj, str) and addr in obj:
        return obj.replace(addr, addr.upper())
    return obj


def test_a_live_record_spelling_its_v6_address_otherwise_still_holds_it(tmp_path, flavour, package_exe):
    """The live allocation holds the dead one's IPv6 address; its record spells it FD00:A:26::9 (by hand) and
    its reservation file is gone (by hand): the record alone holds the address, compared canonically."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conf = sb.native_conflist("nomad-reaper-dualstack.conflist")
        data = json.loads(conf.read_text())
        for p in data["plugins"]:
            if p["type"] == "bridge":
                p["ipam"]["ranges"] = [[{"subnet": "172.26.64.0/24", "rangeStart": "172.26.64.9", "rangeEnd": "172.26.64.9"}],
                                       [{"subnet": "fd00:a:26::/64", "rangeStart": "fd00:a:26::9", "rangeEnd": "fd00:a:26::9"}]]
        conf.write_text(json.dumps(data))
        dead, live, ns_dead, ns_live = unique("alloc-"), unique("alloc-"), sb.container(), sb.container()
        ips_of(sb.driver("add", dead, ns_dead, ("8080:80/tcp",), conf))
        sb.remove_container(ns_dead)
        sweep(sb)
        ips = ips_of(sb.driver("add", live, ns_live, ("8081:80/tcp",), conf))
        v6 = next(i for i in ips if ":" in i)
        sb.edit_record(live, lambda rec: rec.update(_upper(rec, v6)))
        assert v6.upper() in json.dumps(sb.record(live))
        (sb.cni_dir / "networks" / "nomad-reaper-ds" / v6).unlink()
        nb = set(native(sb))
        out = cli(sb, "undo", dead)
        back = sorted(l for l in set(native(sb)) - nb if v6 in l)
        assert back == [], (back, out.stdout, out.stderr)
        assert not (sb.cni_dir / "networks" / "nomad-reaper-ds" / v6).exists(), out.stdout

