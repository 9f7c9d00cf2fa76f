"""Undo against holders host-local's reservations cannot show (found by a red team of the one holder check,
issue 32; each failed before its fix): an address of a static-IPAM network that an attachment being made
holds (Others.ungoverned), and a network directory host-local made after undo's look (undo refuses what
names an address, and says to run it again)."""

from __future__ import annotations

import json
import time

import pytest

from testkit.sandbox import Held, Stack, add_stall_plugin, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NOMAD = Stack("1.9", "go-cni-1.1.13")


def cli(sb, *args, env=None):
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(sb.root / "none")], env=env)


def static(sb, name, bridge, address, without_reaper=False, world="iptables"):
    path = sb.conflist(name=name, bridge=bridge, without_reaper=without_reaper)
    data = json.loads(path.read_text())
    if world == "native":
        for p in data["plugins"]:
            if p["type"] == "bridge":
                p["ipMasqBackend"] = "nftables"
            if p["type"] == "portmap":
                p["backend"] = "nftables"
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["ipam"] = {"type": "static", "addresses": [{"address": address}]}
    out = sb.root / f"{name}-static{'-plain' if without_reaper else ''}.conflist"
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("world", ["iptables", "native"])
def test_undo_puts_back_nothing_of_a_static_address_a_forming_attachment_holds(tmp_path, flavour, package_exe, world):
    """Static IPAM (no reservation governs the address): the dead attachment's DEL cleaned it; a replacement
    with the same static address (another container, another host port) is mid-ADD (held before cni-reaper).
    The sweep itself would remove nothing tied to an ungoverned address on its own word; undo must not put
    back the dead one's rules of that address (the DNAT of 8080 to it, its firewall rules) while an unseen
    holder has it."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conf = static(sb, "net-st", "rts0", "10.73.0.7/24", world=world)
        dead, ns_dead = unique("alloc-"), sb.container()
        [ip] = ips_of(sb.driver("add", dead, ns_dead, ("8080:80/tcp",), conf))
        sb.remove_container(ns_dead)
        assert sb.driver("del", dead, ns_dead, ("8080:80/tcp",), conf).returncode == 0
        assert not [l for l in sb.tables().splitlines() if f"{ip}" in l and "8080" in l]
        stalled, stall_dir = add_stall_plugin(sb, conf)
        live, ns_live = unique("alloc-"), sb.container()
        held = Held(sb, stalled, stall_dir, live, ns_live, ("8081:80/tcp",))
        try:
            held.wait()
            before = set(sb.tables().splitlines()) | set(sb.native_rules())
            out = cli(sb, "undo", dead)
            after = set(sb.tables().splitlines()) | set(sb.native_rules())
            back = sorted(l for l in after - before if ip in l or "8080" in l)
        finally:
            res = held.release()
        assert res.returncode == 0, res.stderr
        assert back == [], (back, out.stdout, out.stderr)


def test_undo_sees_an_address_taken_in_a_network_directory_made_after_its_look(tmp_path, flavour, package_exe):
    """undo locks the network directories that exist when it starts; a network whose directory does not exist
    yet is not locked, so host-local can give the dead one's address there while undo runs (here: while undo
    reads the host port tables, after its look at who holds what). Undo then puts back the dead one's DNAT and
    firewall rules of an address a live allocation holds."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        def one(name, bridge, without_reaper=False):
            path = sb.conflist(name=name, bridge=bridge, without_reaper=without_reaper)
            data = json.loads(path.read_text())
            for p in data["plugins"]:
                if p["type"] == "bridge":
                    p["ipam"]["ranges"] = [[{"subnet": "10.74.0.0/24", "rangeStart": "10.74.0.7",
                                             "rangeEnd": "10.74.0.7"}]]
            path.write_text(json.dumps(data))
            return path

        a = one("net-a", "rta0")
        dead, ns_dead = unique("alloc-"), sb.container()
        [ip] = ips_of(sb.driver("add", dead, ns_dead, ("8080:80/tcp",), a))
        sb.remove_container(ns_dead)
        assert cli(sb, "sweep", "--apply").returncode == 0
        assert not (sb.cni_dir / "networks" / "net-a" / ip).exists()
        # an nft that, the first time undo runs it (its read of the native hostport tables, after the look),
        # waits at a gate
        real = sb.run(["sh", "-c", "command -v nft"], check=True).stdout.strip()
        stand = sb.root / "slow-nft"
        stand.mkdir()
        started, gate = sb.root / "nft-started", sb.root / "nft-gate"
        (stand / "nft").write_text(f'#!/bin/sh\nif [ ! -e "{started}" ]; then touch "{started}"; '
                                   f'while [ ! -e "{gate}" ]; do sleep 0.02; done; fi\nexec "{real}" "$@"\n')
        (stand / "nft").chmod(0o755)
        proc = sb.popen([str(sb.plugin_dir / "cni-reaper"), "undo", dead, "--cni-conf-dir", str(sb.root / "none")],
                        env={"PATH": f"{stand}:{sb.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"})
        try:
            deadline = time.monotonic() + 30
            while not started.exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.01)
            b = one("net-b", "rtb0", without_reaper=True)  # a new network: its directory is made now
            live, ns_live = unique("alloc-"), sb.container()
            assert ips_of(sb.driver("add", live, ns_live, ("9090:80/tcp",), b)) == [ip]
            before = set(sb.tables().splitlines())
        finally:
            gate.touch()
        out, err = proc.communicate(timeout=60)
        back = sorted(l for l in set(sb.tables().splitlines()) - before if ip in l)
        assert back == [], (back, out, err)
