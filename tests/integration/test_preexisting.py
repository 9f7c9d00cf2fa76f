"""What a client already has (issue 33): leaks made before cni-reaper was installed, the classic way, through
go-cni with the reference plugins alone (#6385: a masquerade chain of an allocation deleted after its netns
was removed; #11901: a DNAT chain of one deleted without its port mappings; both DELs succeed, so libcni
keeps no cache entry), and a dead allocation's DNAT restored after its DEL finished. host-local's word
proves them dead (no reservation names them, read under its lock); the ADD that maps a shadowed host port
frees it at once; `sweep --orphans --apply` removes the rest; nothing live is touched. Throwaway namespaces,
both iptables flavours, plugins 1.1.1 and 1.9, IPv4 and dual stack."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

from testkit.sandbox import Held, Stack, add_stall_plugin, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NETWORK = "nomad-reaper"
DUALSTACK = "nomad-reaper-dualstack.conflist"
HOST_IP = "172.26.64.1"


@pytest.fixture(params=[Stack("1.1.1", "go-cni-1.1.7"), Stack("1.9", "go-cni-1.1.13")], ids=lambda s: s.id)
def sb(request, tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, request.param) as sandbox:
        yield sandbox


def cache_entries(sb, cid: str) -> list[str]:
    results = sb.cni_dir / "results"
    return [p.name for p in results.iterdir() if cid in p.name] if results.is_dir() else []


def udp_reaches(sb, netns: str, port: int) -> bool:
    """Datagrams sent from the host netns to the host port arrive in the container (port 80 there)."""
    receiver = sb.udp_receiver(netns, 80)
    try:
        code = ("import socket,sys,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                "for i in range(20):\n s.sendto(b'x',(sys.argv[1],int(sys.argv[2])));time.sleep(0.05)")
        sb.run([sys.executable, "-c", code, HOST_IP, str(port)], check=True)
        import select

        assert receiver.stdout is not None
        ready, _, _ = select.select([receiver.stdout], [], [], 3)
        return bool(ready)
    finally:
        receiver.kill()
        receiver.wait()


def operator(sb, conflist, *args: str):
    """cni-reaper's command line as an operator runs it on the client: its conflist installed."""
    conf_dir = sb.root / "net.d"
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / "10-nomad.conflist").write_text(conflist.read_text())
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(conf_dir)])


def finding(proc, check: str) -> dict:
    found = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == check]
    assert len(found) == 1, proc.stdout + proc.stderr
    return found[0]


def leak(sb, plain, network, ports_a=("8080:80/tcp", "8080:80/udp"), ports_b=("8081:80/tcp",)):
    """#11901 (A: deleted without its port mappings) and #6385 (B: deleted after its netns was removed),
    through the reference chain alone. Returns {cid: ips}."""
    a, b = unique("leak-dnat-"), unique("leak-masq-")
    netns_a, netns_b = sb.container(), sb.container()
    out = {a: ips_of(sb.driver("add", a, netns_a, ports_a, plain)),
           b: ips_of(sb.driver("add", b, netns_b, ports_b, plain))}
    assert sb.driver("del", a, netns_a, (), plain).returncode == 0  # no port mappings: portmap leaves its DNAT
    sb.remove_container(netns_a)
    sb.remove_container(netns_b)
    assert sb.driver("del", b, netns_b, ports_b, plain).returncode == 0  # bridge cannot read the addresses
    for cid in out:
        assert not cache_entries(sb, cid), "both DELs succeeded: libcni keeps no entry"
        assert cid not in sb.reservations(network).values()
    assert [l for l in sb.residue(network, a, out[a]) if "CNI-DN-" in l], "the #11901 leak was not made"
    assert sb.residue(network, b, out[b]), "the #6385 leak was not made"
    return out


@pytest.mark.parametrize("variant", ["ipv4", "dualstack"])
def test_a_client_that_leaked_before_installation_is_reconciled(sb, variant):
    shipped = sb.shipped(DUALSTACK) if variant == "dualstack" else None
    plain, reaper = sb.conflist(shipped, without_reaper=True), sb.conflist(shipped)
    network = json.loads(reaper.read_text())["name"]
    live_before = unique("live-before-")
    netns_live = sb.container()
    live_ips = ips_of(sb.driver("add", live_before, netns_live, ("8090:80/tcp",), plain))
    leaked = leak(sb, plain, network)
    dnat_leak, masq_leak = list(leaked)
    live_rules = sb.residue(network, live_before, live_ips)
    live_reserved = {ip: owner for ip, owner in sb.reservations(network).items() if owner == live_before}

    # cni-reaper appended to the conflist: doctor tells of the leaks, and the first ADD that maps the leaked host
    # port frees it
    leaks = finding(operator(sb, reaper, "doctor", "--json"), "leaks")
    assert leaks["status"] == "WARN" and leaks["message"].startswith("2 dead attachment(s)"), leaks
    assert "sweep --orphans --apply" in leaks["fix"]
    new = unique("new-")
    netns_new = sb.container()
    proc = sb.driver("add", new, netns_new, ("8080:80/tcp", "8080:80/udp"), reaper)
    new_ips = ips_of(proc)
    assert not [l for l in sb.residue(network, dnat_leak, leaked[dnat_leak]) if "CNI-DN-" in l or "dnat" in l]
    assert sb.reach(netns_new, HOST_IP, 8080, "NEW") == "NEW"
    assert udp_reaches(sb, netns_new, 8080)
    lines = [json.loads(l) for l in sb.log_file.read_text().splitlines()]
    assert any(l["msg"].startswith("host port freed") and l["freedFrom"] == dnat_leak for l in lines), lines[-5:]

    reuse = None
    if variant == "ipv4":  # a new allocation given the #6385 leak's address again
        reuse = unique("reuse-")
        netns_reuse = sb.container()
        reuse_ips = ips_of(sb.driver("add", reuse, netns_reuse, ("8095:80/tcp",), reaper,
                                     args=("IgnoreUnknown=1", f"IP={leaked[masq_leak][0]}")))
        assert reuse_ips == leaked[masq_leak]
        reuse_rules = sb.residue(network, reuse, reuse_ips)
    new_rules = sb.residue(network, new, new_ips)

    dry = operator(sb, reaper, "sweep", "--orphans")
    assert masq_leak in dry.stdout and live_before not in dry.stdout and new not in dry.stdout, dry.stdout
    applied = operator(sb, reaper, "sweep", "--orphans", "--apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for cid, ips in leaked.items():  # (the firewall's rules of an address given again are its new holder's)
        assert sb.residue(network, cid, [] if reuse is not None and cid == masq_leak else ips) == [], cid
    assert sb.residue(network, live_before, live_ips) == live_rules
    assert {ip: o for ip, o in sb.reservations(network).items() if o == live_before} == live_reserved
    assert sb.residue(network, new, new_ips) == new_rules
    if reuse is not None:
        assert sb.residue(network, reuse, reuse_ips) == reuse_rules
        assert sb.reach(netns_reuse, HOST_IP, 8095, "REUSE") == "REUSE"
    assert sb.reach(netns_live, HOST_IP, 8090, "LIVE") == "LIVE"


def restored_after_its_del(sb, reaper, port: int) -> tuple[str, list[str]]:
    """An allocation mapping `port`, deleted (the DEL finished, its record gone), then its DNAT back: the nat
    table restored from a dump taken while it ran (a boot-time restore, a configuration tool)."""
    cid = unique("restored-")
    netns = sb.container()
    ips = ips_of(sb.driver("add", cid, netns, (f"{port}:80/tcp",), reaper))
    saved = sb.save(4, "nat")
    assert sb.driver("del", cid, netns, (f"{port}:80/tcp",), reaper).returncode == 0
    sb.remove_container(netns)
    sb.status(name=NETWORK)  # the finished DEL's record goes
    assert sb.record(cid) is None and sb.residue(NETWORK, cid, ips) == []
    sb.run([str(sb.bin_dir / "iptables-restore")], input=saved, check=True)
    assert [l for l in sb.residue(NETWORK, cid, ips) if "CNI-DN-" in l]
    return cid, ips


def test_a_dnat_restored_after_its_del_is_freed_at_the_next_add_but_a_re_add_in_flight_keeps_its_rules(sb):
    reaper = sb.conflist()
    old, old_ips = restored_after_its_del(sb, reaper, 8080)
    third = unique("third-")
    netns_third = sb.container()
    ips_of(sb.driver("add", third, netns_third, ("8080:80/tcp",), reaper))
    assert sb.residue(NETWORK, old, old_ips) == []
    assert sb.reach(netns_third, HOST_IP, 8080, "THIRD") == "THIRD"
    assert sb.driver("del", third, netns_third, ("8080:80/tcp",), reaper).returncode == 0

    # the same container is being added again (held after the reference plugins, before cni-reaper)
    again, _ = restored_after_its_del(sb, reaper, 8081)
    stalled, stall_dir = add_stall_plugin(sb, reaper)
    netns_again = sb.container()
    held = Held(sb, stalled, stall_dir, again, netns_again, ("8086:80/tcp",))
    held.wait()
    forming_rules = [l for l in sb.residue(NETWORK, again, []) if "8086" in l or "POSTROUTING" in l]
    assert forming_rules
    other = unique("other-")
    ips_of(sb.driver("add", other, sb.container(), ("8081:80/tcp",), reaper))
    leaks = finding(operator(sb, reaper, "doctor", "--json"), "leaks")
    assert f"8081/tcp by {', '.join(sorted((again, other)))}" in leaks["message"], leaks
    orphans = operator(sb, reaper, "sweep", "--orphans", "--apply")
    assert "a host-local reservation names it" in orphans.stderr, orphans.stdout + orphans.stderr
    assert orphans.returncode == 6
    now = sb.tables()
    assert [l for l in forming_rules if l not in now] == [], "a rule of the life being made was removed"
    lines = [json.loads(l) for l in sb.log_file.read_text().splitlines()]
    assert any(l["msg"].startswith("host port also mapped") and l.get("mappedBy") == again for l in lines)
    done = held.release()
    assert done.returncode == 0, done.stderr
    assert sb.reach(netns_again, HOST_IP, 8086, "AGAIN") == "AGAIN"


def test_an_add_answers_before_its_look_at_who_else_maps_its_host_ports(sb, tmp_path):
    """The look at every world's hostport tables (who else maps the ports an ADD was given) runs after the
    ADD's answer, in a child of its own (cni/afterwards.py): a table reader that hangs holds no allocation,
    and once it answers the look still frees the port from the dead allocation's DNAT."""
    reaper = sb.conflist()
    old, old_ips = restored_after_its_del(sb, reaper, 8080)
    gate, started = tmp_path / "gate", tmp_path / "nft-started"
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    real_nft = sb.run(["sh", "-c", "command -v nft"], check=True).stdout.strip()
    (stand_in / "nft").write_text(f'#!/bin/sh\necho $$ >> "{started}"\n'
                                  f'while [ ! -e "{gate}" ]; do sleep 0.02; done\nexec "{real_nft}" "$@"\n')
    (stand_in / "nft").chmod(0o755)
    sb.extra_env["PATH"] = f"{stand_in}:{sb.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
    new, netns_new = unique("new-"), sb.container()
    proc = sb.driver("add", new, netns_new, ("8080:80/tcp",), reaper, settle=False)
    try:
        assert proc.returncode == 0, proc.stderr
        for _ in range(1000):  # the look's child starts the reader (before or after the answer)
            if started.exists() and started.read_text().strip():
                break
            time.sleep(0.01)
        pids = [int(p) for p in started.read_text().split()]
        # the reader still waits at its gate: the ADD answered without it (before, the ADD waited for it, and
        # then stopped it at its budget of 3 s before answering)
        assert any(os.path.exists(f"/proc/{p}") for p in pids), "the ADD waited for the table reader"
        assert [l for l in sb.residue(NETWORK, old, old_ips) if "CNI-DN-" in l], "the look ran before the answer"
    finally:
        gate.touch()
    sb.settle()
    del sb.extra_env["PATH"]
    assert sb.residue(NETWORK, old, old_ips) == []
    lines = [json.loads(l) for l in sb.log_file.read_text().splitlines()]
    assert any(l["msg"].startswith("host port freed") and l["freedFrom"] == old for l in lines), lines[-5:]
    assert sb.reach(netns_new, HOST_IP, 8080, "NEW") == "NEW"


def test_a_look_that_loses_the_race_to_free_a_port_does_not_say_the_dead_dnat_stays(sb, tmp_path):
    """Two ADDs on the port a dead allocation's DNAT shadows look side by side (after their answers): the
    first reads the tables and is held at its next nft call; the second reads, judges and frees the port.
    The first then finds nothing left to remove: it reads the tables again before warning, and says the
    port is free instead of "its DNAT stays" (found by a red-team run: it warned, every time)."""
    reaper = sb.conflist()
    old, _ = restored_after_its_del(sb, reaper, 8080)
    gate, calls = tmp_path / "gate", tmp_path / "nft-calls"
    real_nft = sb.run(["sh", "-c", "command -v nft"], check=True).stdout.strip()
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    (stand_in / "nft").write_text(  # the 2nd nft call (the first look's listing of the tags) waits at the gate
        f'#!/bin/bash\nexec 9>>"{calls}.lock"; flock 9; echo $$ >> "{calls}"; n=$(wc -l < "{calls}"); flock -u 9\n'
        f'if [ "$n" = 2 ]; then while [ ! -e "{gate}" ]; do sleep 0.02; done; fi\nexec "{real_nft}" "$@"\n')
    (stand_in / "nft").chmod(0o755)
    sb.extra_env["PATH"] = f"{stand_in}:{sb.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
    done = {}

    def add(cid):
        done[cid] = sb.driver("add", cid, sb.container(), ("8080:80/tcp",), reaper, settle=False)

    def freed() -> bool:
        return any(json.loads(line)["msg"].startswith("host port freed")
                   for line in sb.log_file.read_text().splitlines())

    first, second = unique("first-"), unique("second-")
    a = threading.Thread(target=add, args=(first,))
    b = threading.Thread(target=add, args=(second,))
    a.start()
    try:
        deadline = time.monotonic() + 30
        while not (calls.exists() and len(calls.read_text().split()) >= 2) and time.monotonic() < deadline:
            time.sleep(0.01)
        b.start()
        deadline = time.monotonic() + 30  # the second look frees the port while the first is held
        while time.monotonic() < deadline and not freed():
            time.sleep(0.02)
    finally:
        gate.touch()
        a.join()
        if b.is_alive() or b.ident is not None:
            b.join()
    sb.settle()
    del sb.extra_env["PATH"]
    assert done[first].returncode == 0 and done[second].returncode == 0
    lines = [json.loads(line) for line in sb.log_file.read_text().splitlines()]
    assert any(line["msg"].startswith("host port freed") and line["freedFrom"] == old for line in lines)
    assert not [line for line in lines if line["msg"].startswith("host port also mapped")
                and line.get("mappedBy") == old], "warned that a DNAT stays which another look had removed"
    assert sb.residue(NETWORK, old, []) == []


IN_PROCESS = """#!{python}
import os, sys
from cni_reaper.cni.shell import main_cni
from cni_reaper.verbs.dispatch import dispatch
sys.exit(main_cni(os.environ, dispatch))
"""


def test_an_add_whose_look_cannot_be_detached_looks_once_its_state_lock_is_let_go(tmp_path, flavour):
    """The verbs run in a process that keeps no work for later (cni-reaper's own entry point is not the one
    that runs them): the look runs at once, after the ADD lets go of its state lock, and frees the port. (A
    review found it ran inside that lock, waited lockTimeout for it and gave up: the port stayed shadowed.)"""
    exe = tmp_path / "cni-reaper-in-process"
    exe.write_text(IN_PROCESS.format(python=sys.executable))
    exe.chmod(0o755)
    with open_sandbox(tmp_path / "sb", flavour, str(exe), Stack("1.9", "go-cni-1.1.13")) as sb:
        reaper = sb.conflist()
        old, old_ips = restored_after_its_del(sb, reaper, 8080)
        new, netns_new = unique("new-"), sb.container()
        assert ips_of(sb.driver("add", new, netns_new, ("8080:80/tcp",), reaper))
        lines = [json.loads(line) for line in sb.log_file.read_text().splitlines()]
        assert any(line["msg"].startswith("host port freed") and line["freedFrom"] == old for line in lines), lines[-3:]
        assert sb.residue(NETWORK, old, old_ips) == []
        assert sb.reach(netns_new, HOST_IP, 8080, "NEW") == "NEW"


@pytest.fixture
def native(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, Stack("1.9", "go-cni-1.1.13")) as sandbox:
        yield sandbox


def native_of(sb, cid: str) -> list[str]:
    return [r for r in sb.native_rules() if cid in r]


def test_native_leaks_from_before_installation_are_reconciled(native):
    """The same with the plugins' native nftables backends (bridge `ipMasqBackend`, portmap `backend`)."""
    sb = native
    plain, reaper = sb.native_conflist(without_reaper=True), sb.native_conflist()
    live = unique("live-before-")
    netns_live = sb.container()
    ips_of(sb.driver("add", live, netns_live, ("8090:80/tcp",), plain))
    leaked = leak_natively(sb, plain)
    live_rules = native_of(sb, live)
    assert live_rules

    new = unique("new-")
    netns_new = sb.container()
    ips_of(sb.driver("add", new, netns_new, ("8080:80/tcp", "8080:80/udp"), reaper))
    assert sb.reach(netns_new, HOST_IP, 8080, "NEW") == "NEW"
    assert udp_reaches(sb, netns_new, 8080)
    new_rules = native_of(sb, new)
    applied = operator(sb, reaper, "sweep", "--orphans", "--apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for cid in leaked:
        assert native_of(sb, cid) == [] and sb.residue(NETWORK, cid, []) == [], cid
    assert native_of(sb, live) == live_rules and native_of(sb, new) == new_rules
    assert sb.reach(netns_live, HOST_IP, 8090, "LIVE") == "LIVE"


def leak_natively(sb, plain) -> list[str]:
    a, b = unique("leak-dnat-"), unique("leak-masq-")
    netns_a, netns_b = sb.container(), sb.container()
    ips_of(sb.driver("add", a, netns_a, ("8080:80/tcp", "8080:80/udp"), plain))
    ips_of(sb.driver("add", b, netns_b, ("8081:80/tcp",), plain))
    # bridge 1.9 with its nftables backend fails a DEL once (it tries iptables' masquerade chain too, which it
    # never made); the runtime retries, as Nomad does
    assert any(sb.driver("del", a, netns_a, (), plain).returncode == 0 for _ in range(3))
    sb.remove_container(netns_a)
    sb.remove_container(netns_b)
    assert any(sb.driver("del", b, netns_b, ("8081:80/tcp",), plain).returncode == 0 for _ in range(3))
    assert [r for r in native_of(sb, a) if "dnat to" in r], "portmap's native DNAT did not leak"
    assert [r for r in native_of(sb, b) if "masquerade" in r], "bridge's native masquerade did not leak"
    return [a, b]


def test_observe_mode_journal_and_undo_cover_what_host_locals_word_removes(sb):
    """Observe mode: the ADD on the shadowed port and the orphan sweep remove nothing and say what they would;
    in clean mode what goes is journaled, and undo puts back what no live allocation holds (the DNAT of the
    freed port is refused: the new allocation maps it now)."""
    plain = sb.conflist(without_reaper=True)
    watching = sb.root / "watching.conflist"  # (sb.conflist writes one file per network name)
    watching.write_text(sb.conflist(mode="observe").read_text())
    reaper = sb.conflist()
    leaked = leak(sb, plain, NETWORK)
    dnat_leak, masq_leak = list(leaked)
    before = {cid: sb.residue(NETWORK, cid, ips) for cid, ips in leaked.items()}
    new = unique("new-")
    netns_new = sb.container()
    ips_of(sb.driver("add", new, netns_new, ("8080:80/tcp", "8080:80/udp"), watching))
    observed = operator(sb, watching, "sweep", "--orphans", "--apply")
    assert observed.returncode == 3 and "observe mode" in observed.stdout, observed.stdout + observed.stderr
    assert {cid: sb.residue(NETWORK, cid, ips) for cid, ips in leaked.items()} == before, "observe mode removed"
    lines = [json.loads(l) for l in sb.log_file.read_text().splitlines()]
    assert any(l["msg"].startswith("host port shadowed by the DNAT of a dead allocation, left in place") for l in lines)

    assert sb.status()[0] == 0  # a call of the network in clean mode: its mode is clean from now on
    applied = operator(sb, reaper, "sweep", "--orphans", "--apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert all(sb.residue(NETWORK, cid, ips) == [] for cid, ips in leaked.items())
    journal = json.loads(operator(sb, reaper, "journal", "--json").stdout)
    assert {tuple(r["key"][:2]) for r in journal} >= {(NETWORK, dnat_leak), (NETWORK, masq_leak)}
    undone = operator(sb, reaper, "undo", masq_leak)
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert sb.residue(NETWORK, masq_leak, []) == [l for l in before[masq_leak] if "CNI-FORWARD" not in l]
    refused = operator(sb, reaper, "undo", dnat_leak)
    assert refused.returncode == 4 and "mapped by another allocation" in refused.stdout + refused.stderr
    assert sb.reach(netns_new, HOST_IP, 8080, "NEW") == "NEW"


def test_a_container_that_leaked_before_installation_and_is_added_again_can_be_deleted(sb):
    """#6385 before installation left A's masquerade chain and a jump from its old address; A is added again
    after (Nomad's restart path re-adds the same allocation): bridge takes up the same chain. The orphan sweep
    removes the old jump (an address no life of A has, released), keeps every rule of A's new life, and A's
    DEL then succeeds (bridge cannot delete a chain an old jump still uses)."""
    plain, reaper = sb.conflist(without_reaper=True), sb.conflist()
    a = unique("again-")
    first = sb.container()
    old_ips = ips_of(sb.driver("add", a, first, ("8081:80/tcp",), plain))
    sb.remove_container(first)
    assert sb.driver("del", a, first, ("8081:80/tcp",), plain).returncode == 0
    assert [l for l in sb.residue(NETWORK, a, old_ips) if f"-s {old_ips[0]}/32" in l]
    netns = sb.container()
    new_ips = ips_of(sb.driver("add", a, netns, ("8082:80/tcp",), reaper))
    assert new_ips != old_ips
    live_rules = [l for l in sb.residue(NETWORK, a, new_ips) if f"-s {old_ips[0]}/32" not in l]
    applied = operator(sb, reaper, "sweep", "--orphans", "--apply")
    assert applied.returncode == 0 and f"masquerade jump for {old_ips[0]}/32" in applied.stdout, applied.stdout
    assert sb.residue(NETWORK, a, new_ips) == live_rules
    assert sb.reach(netns, HOST_IP, 8082, "AGAIN") == "AGAIN"
    deleted = sb.driver("del", a, netns, ("8082:80/tcp",), reaper)
    assert deleted.returncode == 0, deleted.stderr
    sb.remove_container(netns)
    assert sb.residue(NETWORK, a, [*old_ips, *new_ips]) == []


def other_network(sb, ipam: str, masq: bool = True, subnet: str = "10.77.0.0/24") -> tuple[object, str]:
    """A live allocation's network beside the swept one, through the reference chain alone with the native
    backends: its own bridge and `subnet`, host-local in a data directory of its own (`custom-dir`) or static
    IPAM (`static`): no reservation of it is where the swept network's are; without `masq`, no rule of it but
    portmap's names the container. Returns (conflist, address)."""
    import ipaddress

    net = ipaddress.ip_network(subnet)
    data = json.loads(sb.native_conflist(without_reaper=True).read_text())
    data["name"] = "other-net"
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["bridge"] = "cniother0"
            p["ipMasq"] = masq
            p["ipam"] = ({"type": "static", "addresses": [{"address": f"{net[5]}/{net.prefixlen}"}]}
                         if ipam == "static" else
                         {"type": "host-local", "dataDir": str(sb.cni_dir / "other-dir"), "ranges": [[{"subnet": subnet}]]})
    path = sb.root / f"other-{ipam}.conflist"
    path.write_text(json.dumps(data))
    return path, str(net[5] if ipam == "static" else net[2])


@pytest.mark.parametrize("ipam", ["custom-dir", "static"])
def test_a_live_allocation_of_another_network_keeps_its_native_dnat(native, ipam):
    """portmap's native rules name no network: a container they name with no reservation where the swept
    network keeps its own is not that network's unless their addresses are in its subnets. Neither the orphan
    sweep nor an ADD that maps the same host port removes the live allocation's DNAT on another network."""
    sb = native
    other, address = other_network(sb, ipam, masq=False)
    live = unique("other-live-")
    ips = ips_of(sb.driver("add", live, sb.container(), ("8085:80/tcp",), other))
    assert ips == [address]
    kept_by_sweep_and_add(sb, live)


def kept_by_sweep_and_add(sb, live: str) -> None:
    """Neither `sweep --orphans --apply` nor an ADD on the swept network mapping host port 8085 changes a
    line of live allocation `live` (of another network, its native DNAT on that port); the ADD warns."""
    rules = native_of(sb, live)
    assert [r for r in rules if "dnat to" in r], rules
    tables = [l for l in sb.tables() if live in l]
    reaper = sb.native_conflist()
    applied = operator(sb, reaper, "sweep", "--orphans", "--apply")
    assert applied.returncode in (0, 6), applied.stdout + applied.stderr
    assert native_of(sb, live) == rules, "the orphan sweep removed a live allocation's rules on another network"
    ips_of(sb.driver("add", unique("new-"), sb.container(), ("8085:80/tcp",), reaper))
    assert native_of(sb, live) == rules, "an ADD mapping the same port removed a live allocation's rules"
    assert [l for l in sb.tables() if live in l] == tables
    lines = [json.loads(l) for l in sb.log_file.read_text().splitlines()]
    assert any(l["msg"].startswith("host port also mapped") and l.get("mappedBy") == live for l in lines), lines[-5:]


@pytest.mark.parametrize("ipam", ["custom-dir", "static"])
def test_a_live_allocation_of_a_network_inside_the_swept_subnet_keeps_its_native_dnat(native, ipam):
    """Another network whose subnet lies inside the swept one's (its own bridge, its own host-local directory
    or static IPAM): its live allocation's native DNAT names an address the swept subnet holds, and no
    reservation where the swept network keeps its own. The host's interfaces tell the networks apart (the
    address is on the other bridge's narrower network): neither the orphan sweep nor an ADD mapping the same
    host port touches its rules."""
    sb = native
    other, address = other_network(sb, ipam, masq=False, subnet="172.26.70.0/24")
    live = unique("inside-")
    netns = sb.container()
    assert ips_of(sb.driver("add", live, netns, ("8085:80/tcp", "8085:80/udp"), other)) == [address]
    kept_by_sweep_and_add(sb, live)


def test_a_container_leaked_on_the_swept_network_keeps_its_live_dnat_on_another(native):
    """One container ID on two networks: a #6385 leak of its native masquerade on the swept network (dead:
    no reservation names it there) and a live attachment on another network (host-local in a directory of its
    own) mapping a host port. The leak goes; the other network's DNAT is not taken for the leak's."""
    sb = native
    plain, reaper = sb.native_conflist(without_reaper=True), sb.native_conflist()
    other, _ = other_network(sb, "custom-dir")
    cid = unique("two-nets-")
    first = sb.container()
    ips_of(sb.driver("add", cid, first, (), plain))
    sb.remove_container(first)
    assert any(sb.driver("del", cid, first, (), plain).returncode == 0 for _ in range(3))
    leaked = [r for r in native_of(sb, cid) if "masquerade" in r]
    assert leaked, "bridge's native masquerade did not leak"
    ips_of(sb.driver("add", cid, sb.container(), ("8085:80/tcp",), other))
    dnat = [r for r in native_of(sb, cid) if "dnat to" in r]
    assert dnat
    applied = operator(sb, reaper, "sweep", "--orphans", "--apply")
    assert applied.returncode in (0, 6), applied.stdout + applied.stderr
    now = native_of(sb, cid)
    assert [r for r in dnat if r not in now] == [], applied.stdout + applied.stderr
    assert not [r for r in leaked if r in now], "the leak on the swept network stayed"


def test_an_in_flight_add_of_a_network_whose_ipam_changed_keeps_its_rules(sb):
    """The records saw host-local keep the network; its conflist now gives static addresses. An ADD in flight
    under the new conflist holds no reservation, and its rules are not proven dead by the old directory."""
    reaper = sb.conflist()
    recorded = unique("recorded-")
    ips_of(sb.driver("add", recorded, sb.container(), ("8086:80/tcp",), reaper))
    data = json.loads(reaper.read_text())
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["ipam"] = {"type": "static", "addresses": [{"address": "172.26.64.200/20"}]}
    static = sb.root / "static.conflist"
    static.write_text(json.dumps(data))
    stalled, stall_dir = add_stall_plugin(sb, static)
    flying = unique("flying-")
    netns = sb.container()
    held = Held(sb, stalled, stall_dir, flying, netns, ("8087:80/tcp",))
    held.wait()
    forming = sb.residue(NETWORK, flying, ["172.26.64.200"])
    assert forming
    swept = operator(sb, static, "sweep", "--orphans", "--apply")
    assert swept.returncode in (0, 6), swept.stdout + swept.stderr
    now = sb.tables()
    assert [l for l in forming if l not in now] == [], "a rule of the ADD in flight was removed"
    done = held.release()
    assert done.returncode == 0, done.stderr
    assert sb.reach(netns, HOST_IP, 8087, "FLYING") == "FLYING"


def test_a_late_del_after_a_boot_of_an_allocation_from_before_installation_spares_its_addresss_new_holder(sb):
    """An allocation made before installation dies with the host; the boot empties host-local's directory
    (a tmpfs, Nomad 1.9.4+) and restores the rules. The first ADD after the boot takes its address again; the
    dead one's late DEL (libcni hands the firewall plugin its cached result) must not remove the new holder's
    rules: that ADD made libcni's cache forget the dead addresses."""
    plain, reaper = sb.conflist(without_reaper=True), sb.conflist()
    old = unique("before-")
    old_netns = sb.container()
    old_ips = ips_of(sb.driver("add", old, old_netns, ("8088:80/tcp",), plain))
    sb.reboot(tmpfs_dirs=("networks",))
    new = unique("after-boot-")
    netns = sb.container()
    new_ips = ips_of(sb.driver("add", new, netns, ("8089:80/tcp",), reaper, args=("IgnoreUnknown=1", f"IP={old_ips[0]}")))
    assert new_ips == old_ips
    forward = [l for l in sb.residue(NETWORK, new, new_ips) if l.startswith("-A CNI-FORWARD")]
    assert forward
    late = sb.driver("del", old, old_netns, ("8088:80/tcp",), reaper)
    assert late.returncode == 0, late.stderr
    now = sb.tables()
    assert [l for l in forward if l not in now] == [], "the late DEL removed the new holder's firewall rules"
    assert {ip: o for ip, o in sb.reservations(NETWORK).items() if o == new} == {new_ips[0]: new}
    assert sb.reach(netns, HOST_IP, 8089, "NEW") == "NEW"


def test_a_re_add_in_flight_after_a_boot_keeps_its_reservation_whatever_the_clock_said(sb):
    """An allocation from before installation dies with the host; the boot empties host-local's directory,
    and the clock had run ahead before it (its cache entry is dated in the future). Nomad adds it again (the
    same ID) and that ADD is held after bridge reserved its address; meanwhile the first ADD of the boot
    through cni-reaper makes libcni's cache forget the dead life's addresses. The re-ADD's new reservation
    and rules stay, and it finishes and gets traffic."""
    import os

    plain, reaper = sb.conflist(without_reaper=True), sb.conflist()
    x = unique("skewed-")
    ips_of(sb.driver("add", x, sb.container(), ("8091:80/tcp",), plain))
    sb.reboot(tmpfs_dirs=("networks",))
    ahead = os.stat(sb.cni_dir).st_mtime + 86400
    for name in cache_entries(sb, x):
        os.utime(sb.cni_dir / "results" / name, (ahead, ahead))
    stalled, stall_dir = add_stall_plugin(sb, reaper)
    netns = sb.container()
    held = Held(sb, stalled, stall_dir, x, netns, ("8091:80/tcp",))
    held.wait()
    forming = {ip: o for ip, o in sb.reservations(NETWORK).items() if o == x}
    assert forming
    rules = [l for l in sb.residue(NETWORK, x, list(forming)) if not l.startswith("reservation")]
    first = unique("first-of-boot-")
    ips_of(sb.driver("add", first, sb.container(), ("8092:80/tcp",), reaper))
    assert {ip: o for ip, o in sb.reservations(NETWORK).items() if o == x} == forming, "the re-ADD's reservation went"
    now = sb.tables()
    assert [l for l in rules if l not in now] == [], "a rule of the re-ADD in flight was removed"
    done = held.release()
    assert done.returncode == 0, done.stderr
    assert sb.reach(netns, HOST_IP, 8091, "AGAIN") == "AGAIN"
