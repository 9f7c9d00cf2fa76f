"""Everything a dead attachment leaves, on every backend (issue): the native nftables tables of the reference
plugins 1.6+ (bridge `ipMasqBackend: nftables`, portmap `backend: nftables`; measured with 1.9.x through
go-cni), and the conntrack entries that keep UDP flows pinned to a dead IP. Real traffic between namespaces
made here, both iptables flavours (the firewall plugin still uses iptables), throwaway namespaces."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from testkit.sandbox import Stack, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NOMAD = Stack("1.9", "go-cni-1.1.13")
PORTS = ("8080:80/tcp", "8080:80/udp")


@pytest.fixture(params=[NOMAD, Stack("1.9")], ids=lambda s: s.id)
def sb(request, tmp_path, flavour, reaper_exe):
    with open_sandbox(tmp_path, flavour, reaper_exe, request.param) as sandbox:
        yield sandbox


def of(sandbox, cid: str, ips: list[str]) -> list[str]:
    """The native rules of one attachment: its ID in the comment and one of its addresses in the rule."""
    return [r for r in sandbox.native_rules() if cid in r and any(ip in r for ip in ips)]


@pytest.mark.parametrize("variant", ["ipv4", "dualstack"])
def test_del_with_the_netns_gone_leaves_nothing_native_and_a_live_neighbour_is_untouched(sb, variant):
    name = "nomad-reaper-dualstack.conflist" if variant == "dualstack" else "nomad-reaper.conflist"
    conflist = sb.native_conflist(name)
    live, dead = unique("alloc-"), unique("alloc-")
    live_ns, dead_ns = sb.container(), sb.container()
    live_ips = ips_of(sb.driver("add", live, live_ns, ("9090:90/tcp", "9090:90/udp"), conflist))
    dead_ips = ips_of(sb.driver("add", dead, dead_ns, PORTS, conflist))
    assert len(of(sb, dead, dead_ips)) == (5 if variant == "ipv4" else 9)  # masq, 2 DNAT, hairpin(s) per family
    live_rules = of(sb, live, live_ips)
    others = [r for r in sb.native_rules() if dead not in r]
    sb.remove_container(dead_ns)
    proc = sb.driver("del", dead, dead_ns, PORTS, conflist)
    assert proc.returncode == 0, proc.stderr
    assert of(sb, dead, dead_ips) == [] and not [r for r in sb.native_rules() if dead in r]
    assert sb.residue(json.loads(conflist.read_text())["name"], dead, dead_ips) == []
    assert of(sb, live, live_ips) == live_rules and [r for r in sb.native_rules() if dead not in r] == others


def test_an_allocation_that_died_without_del_does_not_shadow_its_host_port(sb):
    """Native portmap rules leak only when no DEL comes; the next allocation on the same host port must get
    the traffic: a real TCP connection from the host netns reaches it."""
    conflist = sb.native_conflist()
    dead = unique("alloc-")
    dead_ns = sb.container()
    dead_ips = ips_of(sb.driver("add", dead, dead_ns, PORTS, conflist))
    sb.remove_container(dead_ns)  # the client lost it: no DEL
    live_ns = sb.container()
    ips_of(sb.driver("add", unique("alloc-"), live_ns, PORTS, conflist))
    assert of(sb, dead, dead_ips) == []
    assert sb.reach(live_ns, "172.26.64.1", 8080, "new") == "new"


def test_gc_and_orphans_cover_native_rules(sb):
    """Leaks from before cni-reaper was installed, found by the hash in bridge's native comment."""
    if sb.stack.cni_version != "1.1.0":
        pytest.skip("GC needs CNI 1.1.0 (libcni 1.3)")
    keep, early = unique("alloc-"), unique("alloc-")
    keep_ns, early_ns = sb.container(), sb.container()
    keep_ips = ips_of(sb.driver("add", keep, keep_ns, ("9090:90/tcp",), sb.native_conflist()))
    plain = sb.native_conflist(without_reaper=True)
    early_ips = ips_of(sb.driver("add", early, early_ns, PORTS, plain))
    kept = of(sb, keep, keep_ips)
    assert of(sb, early, early_ips)
    gc = sb.driver("gc", conflist=sb.native_conflist(), valid=(f"{keep}:eth0",))
    # libcni's own DEL of the cached invalid attachment fails in bridge 1.9.x (its live-netns teardown with
    # ipMasqBackend nftables also deletes an iptables jump that never existed: test_reference_plugins.py);
    # libcni goes on to GC, and cni-reaper's GC removes what is left
    assert gc.returncode == 0 or 'plugin type="bridge" failed (delete)' in gc.stderr, gc.stderr
    assert of(sb, early, early_ips) == [] and of(sb, keep, keep_ips) == kept


# -- conntrack --------------------------------------------------------------------------------------
@pytest.fixture(params=["iptables", "native"])
def backend(request):
    return request.param


@pytest.mark.parametrize("runtime", ["go-cni-1.1.7", "go-cni-1.1.13"])
def test_a_udp_client_that_keeps_sending_reaches_the_new_allocation_within_a_second(tmp_path, flavour, backend,
                                                                                   runtime, reaper_exe):
    """A dead allocation's UDP host port, a client that keeps sending from one source port: its conntrack
    entry points at the dead IP and every packet refreshes it. The new allocation on the same port must
    receive the client's packets within 1 s of its ADD returning. Without STATUS (Nomad before 1.9.5, or a
    1.0.0 conflist) the dead DNAT is still there while portmap's ADD runs, so the entry portmap clears is
    made again before cni-reaper removes that DNAT: only cni-reaper's own conntrack clean-up saves the flow.
    With STATUS (Nomad 1.9.5+) the sweep runs before portmap's ADD."""
    plugins = "1.9" if backend == "native" else "1.1.1"
    with open_sandbox(tmp_path, flavour, reaper_exe, Stack(plugins, runtime)) as sb:
        conflist = sb.native_conflist() if backend == "native" else sb.conflist()
        client, host_ip = sb.outside()
        dead_ns = sb.container()
        dead_ips = ips_of(sb.driver("add", unique("alloc-"), dead_ns, ("5353:53/udp",), conflist))
        sender = sb.udp_sender(client, host_ip, 5353)
        try:
            deadline, pinned = time.monotonic() + 10, ""
            while "dport=5353" not in pinned and time.monotonic() < deadline:  # the sender has started
                time.sleep(0.1)
                pinned = sb.run(["conntrack", "-L", "-p", "udp", "--reply-src", dead_ips[0]]).stdout
            assert "dport=5353" in pinned, pinned
            sb.remove_container(dead_ns)  # died with its client: no DEL
            time.sleep(0.3)
            new_ns = sb.container()
            receiver = sb.udp_receiver(new_ns, 53)
            try:
                add = sb.driver("add", unique("alloc-"), new_ns, ("5353:53/udp",), conflist)
                added = time.time()
                ips_of(add)
                time.sleep(1.5)
                receiver.kill()
                got = [float(t) for t in receiver.communicate(timeout=10)[0].split()]
            finally:
                receiver.kill()
        finally:
            sender.kill()
            sender.wait()
        assert got, "the new allocation received nothing: the client's flow stayed pinned to the dead IP"
        assert got[0] - added <= 1.0, f"first packet {got[0] - added:.2f} s after the ADD returned"
        assert "conntrack:" in sb.log_file.read_text()


ECHO = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('0.0.0.0',80));s.listen(1);print('ready',flush=True);c,_=s.accept()\nwhile True:\n d=c.recv(100)\n if not d: break\n c.sendall(d)")


def test_a_live_allocations_established_connection_survives_the_clean_up_of_a_dead_neighbour(tmp_path, flavour,
                                                                                              backend, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conflist = sb.native_conflist() if backend == "native" else sb.conflist()
        client, host_ip = sb.outside()
        live_ns, dead_ns = sb.container(), sb.container()
        ips_of(sb.driver("add", unique("alloc-"), live_ns, ("8080:80/tcp",), conflist))
        dead_ips = ips_of(sb.driver("add", unique("alloc-"), dead_ns, ("8081:80/tcp", "8081:80/udp"), conflist))
        echo = subprocess.Popen(["ip", "netns", "exec", live_ns.rsplit("/", 1)[1], sys.executable, "-c", ECHO],
                                stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "ready"  # listening before the client connects
        talk = subprocess.Popen(["ip", "netns", "exec", client, sys.executable, "-c", TALK, host_ip, "8080"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert talk.stdout.readline().strip() == "echo 1"
            sb.remove_container(dead_ns)
            assert sb.status()[0] == 0  # the sweep cleans the dead neighbour, conntrack included
            assert sb.run(["conntrack", "-L", "--reply-src", dead_ips[0]]).stdout.strip() == ""
            talk.stdin.write("go\n")
            talk.stdin.flush()
            assert talk.stdout.readline().strip() == "echo 2", "the live connection broke"
        finally:
            talk.kill()
            echo.kill()


TALK = ("import socket,sys\ns=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=10)\n"
        "s.sendall(b'1');print('echo', s.recv(10).decode(),flush=True)\nsys.stdin.readline()\n"
        "s.sendall(b'2');print('echo', s.recv(10).decode(),flush=True)")


def test_conntrack_module_agrees_with_pyroute2(tmp_path, package_exe):
    """The ctnetlink client (cni_reaper.conntrack) reads the same entries pyroute2 reads, and deletes
    exactly those of the given addresses, in both families."""
    with open_sandbox(tmp_path, "nft", package_exe) as sb:
        entries = [("udp", "192.0.2.1", "198.51.100.1", "10.9.0.5", 1000 + i) for i in range(20)]
        entries += [("tcp", "fd00::1", "fd00::99", "fd00::99", 2000 + i) for i in range(5)]
        entries += [("udp", "192.0.2.1", "10.77.0.5", "10.77.0.5", 3000)]
        for proto, src, dst, reply_src, port in entries:
            argv = ["conntrack", "-I", "-p", proto, "-s", src, "-d", dst, "--sport", str(port), "--dport", "53",
                    "-r", reply_src, "-q", src, "--reply-port-src", "53", "--reply-port-dst", str(port), "-t", "100"]
            if proto == "tcp":
                argv += ["--state", "ESTABLISHED"]
            sb.run(argv, check=True)
        probe = ("import json,socket,sys\nfrom cni_reaper.reap import conntrack\nfrom pyroute2.netlink.nfnetlink.nfctsocket import NFCTSocket\n"
                 "ours=[]\nwith conntrack.Socket() as ct:\n for f in (socket.AF_INET, socket.AF_INET6):\n"
                 "  ours += [(e.orig_dst, e.reply_src) for e in ct.dump(f)]\n"
                 "theirs=[]\nfor f in (socket.AF_INET, socket.AF_INET6):\n s=NFCTSocket(nfgen_family=f)\n k='V4' if f==socket.AF_INET else 'V6'\n"
                 " for m in s.dump():\n  o=m.get_attr('CTA_TUPLE_ORIG').get_attr('CTA_TUPLE_IP'); r=m.get_attr('CTA_TUPLE_REPLY').get_attr('CTA_TUPLE_IP')\n"
                 "  theirs.append((o.get_attr(f'CTA_IP_{k}_DST'), r.get_attr(f'CTA_IP_{k}_SRC')))\n s.close()\n"
                 "cleared = conntrack.clear({'10.9.0.5', 'fd00::99'}, lambda counts: None)\n"
                 "print(json.dumps({'ours': sorted(ours), 'theirs': sorted(theirs), 'cleared': cleared}))")
        out = json.loads(sb.run([sys.executable, "-c", probe], check=True).stdout)
        assert out["ours"] == out["theirs"] and len(out["ours"]) == len(entries)
        assert out["cleared"] == {"10.9.0.5": 20, "fd00::99": 5}
        left = sb.run(["conntrack", "-L"]).stdout + sb.run(["conntrack", "-L", "-f", "ipv6"]).stdout
        assert "10.77.0.5" in left and "10.9.0.5" not in left and "fd00::99" not in left


def test_conntrack_entries_of_an_address_a_live_attachment_holds_stay(tmp_path, package_exe):
    """An IP is handed out again: a dead record and a live one both name it. The dead one's clean-up must not
    cut the live one's flows."""
    from testkit.artifacts import conntrack_entry, write_records, write_reservations

    with open_sandbox(tmp_path, "nft", package_exe) as sb:
        live_ns = sb.container()
        # host-local handed 172.26.9.9 to live-1 after dead-1 released it; dead-2 still holds its own
        write_reservations(sb.cni_dir / "networks", "nomad-reaper", [("live-1", "172.26.9.9"), ("dead-2", "172.26.9.10")])
        write_records(sb, "nomad-reaper", [("dead-1", "172.26.9.9", 20000, "/var/run/netns/gone-1"),
                                                       ("dead-2", "172.26.9.10", 20001, "/var/run/netns/gone-2"),
                                                       ("live-1", "172.26.9.9", 20002, live_ns)])
        for ip, port in (("172.26.9.9", 1), ("172.26.9.10", 2)):
            sb.run(["conntrack", *conntrack_entry(ip, port)], check=True)
        assert sb.status()[0] == 0
        flows = sb.run(["conntrack", "-L"]).stdout
        assert "src=172.26.9.9 " in flows and "src=172.26.9.10 " not in flows
        assert {r["containerID"] for r in sb.records()} == {"live-1"}
