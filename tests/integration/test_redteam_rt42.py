"""Red team rt42: the promise "nothing a live or forming allocation holds is ever removed or shadowed, whoever
made it; dead only on positive evidence; observe mode (from any source) removes nothing anywhere; undo puts back
nothing a live holder holds", attacked in throwaway namespaces. Tests that FAIL on main are breaks; those marked
"held" in their docstring passed (the promise held)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testkit.sandbox import Stack, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
NOMAD = Stack("1.9", "go-cni-1.1.13")


@pytest.fixture
def box(tmp_path, package_exe):
    with open_sandbox(tmp_path, "nft", package_exe, NOMAD) as sb:
        yield sb


def _leak(sb, port: str, conflist=None) -> tuple[str, list[str]]:
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, (port,), conflist))
    sb.remove_container(netns)
    return cid, ips


def _mapped(sb, port: int) -> list[str]:
    """Every rule of the plugins (iptables or native) that names host port `port`."""
    return sb.rules_naming_port(port)


# -- undo against holders that are not cni-reaper's ---------------------------------------------------------
UDP_BOUND = ("import socket,sys,time;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
             "s.bind(('0.0.0.0',int(sys.argv[1])));print('ready',flush=True);time.sleep(120)")
TCP6_LISTEN = ("import socket,sys,time;s=socket.socket(socket.AF_INET6);"
               "s.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_V6ONLY,0);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
               "s.bind(('::',int(sys.argv[1])));s.listen(8);print('ready',flush=True);time.sleep(120)")


def _holder(sb, kind: str, port: int, proto: str, priority: str = "-100"):
    """Start a holder of host port `port` that is not cni-reaper's; returns something to stop, or None."""
    if kind in ("udp-socket", "tcp6-socket"):
        code = UDP_BOUND if kind == "udp-socket" else TCP6_LISTEN
        p = subprocess.Popen(sb.wrap([sys.executable, "-c", code, str(port)]), env=sb.env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        return p
    if kind == "prerouting-dnat":
        for rule in (["-t", "nat", "-I", "PREROUTING", "-p", proto, "--dport", str(port), "-j", "DNAT",
                      "--to-destination", "172.31.9.2:80"],
                     ["-t", "nat", "-I", "OUTPUT", "-p", proto, "--dport", str(port), "-j", "DNAT",
                      "--to-destination", "172.31.9.2:80"]):
            sb.run(["iptables", *rule], check=True)
        return None
    if kind == "whole-address-dnat":  # an operator's 1:1 NAT of a host address: every port of it, appended
        for chain in ("PREROUTING", "OUTPUT"):
            sb.run(["iptables", "-t", "nat", "-A", chain, "-d", "172.26.64.1", "-p", proto, "-j", "DNAT",
                    "--to-destination", "172.31.9.2:80"], check=True)
        return None
    if kind == "foreign-nft-table":
        script = (f"add table ip someone\n"
                  f"add chain ip someone pre {{ type nat hook prerouting priority {priority}; }}\n"
                  f"add chain ip someone out {{ type nat hook output priority {priority}; }}\n"
                  f"add rule ip someone pre {proto} dport {port} dnat to 172.31.9.2:80\n"
                  f"add rule ip someone out {proto} dport {port} dnat to 172.31.9.2:80\n")
        sb.run(["nft", "-f", "-"], input=script, check=True)
        return None
    raise AssertionError(kind)


@pytest.mark.parametrize("world", ["iptables", "native"])
@pytest.mark.parametrize("kind,proto", [("udp-socket", "udp"), ("tcp6-socket", "tcp"), ("prerouting-dnat", "tcp"),
                                        ("foreign-nft-table", "tcp"), ("whole-address-dnat", "tcp")])
def test_undo_puts_back_no_dnat_of_a_port_a_holder_not_cni_reapers_holds(box, world, kind, proto):
    """Promise: undo puts back nothing a live holder holds (README "Undo": "a host port something else holds now
    ... another chain's DNAT ... a socket listening on the host"). A dead allocation mapping host port P is
    swept; then something not cni-reaper's holds P: a bound UDP socket, a dual-stack TCP listener on `::`, an
    operator's DNAT directly in nat PREROUTING/OUTPUT, or a native nftables table of someone else's with a
    DNAT of P, or an operator's DNAT of a whole host address (no --dport: every port). `cni-reaper undo` must put
    back none of the dead DNAT of P.
    BREAK for foreign-nft-table and whole-address-dnat (both worlds); held for udp-socket, tcp6-socket and
    prerouting-dnat. Root cause: reap/holders.py port_map() reads only the iptables nat tables and the plugins'
    own native tables (NftBackend().read() lists nftables/backend.py TABLES), and rule_ports() gives a rule that
    matches no port no port at all, so neither holder is in the PortMap that undo's _IptablesPlan._conflict and
    _native_verdict ask.
    Reproduce: pytest -k test_undo_puts_back_no_dnat_of_a_port_a_holder_not_cni_reapers_holds."""
    sb = box
    port = 8111
    conf = sb.native_conflist() if world == "native" else sb.conflist()
    cid, _ips = _leak(sb, f"{port}:80/{proto}", conf)
    assert sb.cli("sweep", "--apply").returncode == 0
    assert _mapped(sb, port) == []
    stop = _holder(sb, kind, port, proto)
    try:
        out = sb.cli("undo", cid)
        back = _mapped(sb, port)
    finally:
        if stop is not None:
            stop.kill()
            stop.wait()
    assert back == [], (back, out.stdout, out.stderr)
    assert out.returncode == 4, out.stdout


def _foreign_live(sb, port: int, kind: str = "foreign-nft-table"):
    """A live task behind a native nftables table of someone else's (not the plugins', not iptables'): a namespace
    at 172.31.9.2 serving on port 80, and the table DNATting host port `port` to it."""
    from testkit.foreign import foreign_task

    live = foreign_task(sb)
    _holder(sb, kind, port, "tcp", priority="-90")  # dstnat + 10, as firewalld's nat chains
    return live


@pytest.mark.parametrize("world", ["iptables", "native"])
def test_undo_shadows_a_live_task_behind_someone_elses_nft_table(box, world):
    """BREAK. Promise: undo puts back nothing that shadows a live holder ("a host port something else holds now").
    A dead allocation mapped host port 8112 and was swept; then a live task gets that port through a native
    nftables table that is neither the plugins' nor iptables' (a firewall manager's: firewalld's nat chains hook
    at `dstnat + 10`). Before undo, connections to the port reach the live task; `cni-reaper
    undo` of the dead allocation puts its DNAT back (exit 0, nothing refused) and connections then go to the dead
    address. Root cause: holders.port_map() reads the iptables nat tables and the plugins' own native tables
    (NftBackend().read(), TABLES) only, never another nftables table's DNAT."""
    sb = box
    port = 8112
    conf = sb.native_conflist() if world == "native" else sb.conflist()
    cid, _ips = _leak(sb, f"{port}:80/tcp", conf)
    assert sb.cli("sweep", "--apply").returncode == 0
    live = _foreign_live(sb, port)
    gw = "172.26.64.1"
    assert sb.reach(live, gw, port, "someone-elses-task") == "someone-elses-task"
    out = sb.cli("undo", cid)
    after = sb.reach(live, gw, port, "someone-elses-task")
    assert after == "someone-elses-task", (after, _mapped(sb, port), out.returncode, out.stdout)


@pytest.mark.parametrize("world", ["iptables"])
def test_undo_shadows_a_live_task_behind_an_operators_whole_address_dnat(box, world):
    """BREAK. The same promise: an operator's DNAT of a whole host address (`-A PREROUTING -d 172.26.64.1 -p tcp -j
    DNAT --to-destination 172.31.9.2:80`, and in OUTPUT: no --dport, so it holds every TCP port of the address)
    reaches a live task; `undo` of a swept dead allocation that mapped host port 8114 puts its DNAT back (exit 0)
    and connections to 172.26.64.1:8114 then go to the dead address. Root cause: holders.rule_ports() gives no port
    for a DNAT that matches none, so holders._foreign_holders' rule holds nothing in PortMap (reap/holders.py,
    `add_iptables(others=True)`): a rule matching every port is taken as holding none. (The native world's put-back
    happens too, see the parametrized test above, but there the operator's iptables rule is evaluated first.)"""
    sb = box
    port = 8114
    conf = sb.native_conflist() if world == "native" else sb.conflist()
    cid, _ips = _leak(sb, f"{port}:80/tcp", conf)
    assert sb.cli("sweep", "--apply").returncode == 0
    live = _foreign_live(sb, port, "whole-address-dnat")
    gw = "172.26.64.1"
    assert sb.reach(live, gw, port, "operators-task") == "operators-task"
    out = sb.cli("undo", cid)
    after = sb.reach(live, gw, port, "operators-task")
    assert after == "operators-task", (after, _mapped(sb, port), out.returncode, out.stdout)


# -- observe mode from the settings file ---------------------------------------------------------------------
@pytest.mark.parametrize("networks", [{NET: "observe"}, {NET: ["observe"]}, {NET: True}],
                         ids=["string", "list", "bool"])
def test_a_per_network_mode_the_settings_file_cannot_use_observes(box, networks):
    """BREAK. Promise: observe from any source removes nothing; README: "A value cni-reaper cannot use observes"
    and "a settings file that cannot be used observes the networks it governs". The settings file's per-network
    entry is not an object (`"networks": {"nomad-reaper": "observe"}`, a list, a bool): it is dropped without a
    word (cni/settings_file.py `_take`: `if isinstance(keys, dict)`; no `problem`), so the network is in clean
    mode and `sweep --apply --orphans --config FILE` removes a leak of it. With `"networks": "observe"` (the whole
    key unusable) or `{"mode": "observe"}` per network it observes."""
    sb = box
    cid, ips = _leak(sb, "8115:80/tcp", sb.conflist(without_reaper=True))
    before = sb.residue(NET, cid, ips)
    assert before
    settings = sb.root / "config.json"
    settings.write_text(json.dumps({"networks": networks}))
    out = sb.cli("sweep", "--apply", "--orphans", "--config", str(settings))
    assert sb.residue(NET, cid, ips) == before, (out.returncode, out.stdout, out.stderr)


def test_held_a_per_network_observe_object_observes(box):
    """held (the control of the test above): `"networks": {"nomad-reaper": {"mode": "observe"}}` removes
    nothing of the leak."""
    sb = box
    cid, ips = _leak(sb, "8116:80/tcp", sb.conflist(without_reaper=True))
    before = sb.residue(NET, cid, ips)
    settings = sb.root / "config.json"
    settings.write_text(json.dumps({"networks": {NET: {"mode": "observe"}}}))
    out = sb.cli("sweep", "--apply", "--orphans", "--config", str(settings))
    assert sb.residue(NET, cid, ips) == before, (out.returncode, out.stdout, out.stderr)


# -- a namespace alive elsewhere ------------------------------------------------------------------------------
SERVE = ("import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
         "s.bind(('0.0.0.0',80));s.listen(1);s.settimeout(20);print('ready',flush=True);c,_=s.accept();"
         "c.sendall(sys.argv[1].encode());c.close()")


def _reach_at(sb, ns_path: str, host_ip: str, port: int, reply: str) -> str:
    """Serve `reply` on port 80 in the namespace at `ns_path` (any path, `nsenter`), connect to host_ip:port."""
    server = subprocess.Popen(["nsenter", f"--net={ns_path}", sys.executable, "-c", SERVE, reply],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stderr is not None
        assert server.stdout.readline().strip() == "ready", server.stderr.read()
        return sb.connect(host_ip, port)
    finally:
        server.kill()
        server.wait()

@pytest.mark.parametrize("reused", [False, True], ids=["path-gone", "path-reused"])
@pytest.mark.parametrize("chain", ["reaper", "plain"])
def test_held_a_netns_bind_mounted_elsewhere_is_alive(box, tmp_path, reused, chain):
    """held. A container's netns is bind-mounted elsewhere (a debugger's `nsenter` helper, another runtime's
    copy) and its path is removed (and, with path-reused, a new namespace made at the same path: same path, new
    inode). The namespace, its veth and its address are alive: no sweep (`sweep --apply`, with `--orphans`
    for a network without cni-reaper, STATUS) removes anything of it."""
    import os

    sb = box
    conf = sb.conflist() if chain == "reaper" else sb.conflist(without_reaper=True)
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, ("8117:80/tcp",), conf))
    before = sb.residue(NET, cid, ips)
    keep = tmp_path / "kept-netns"
    keep.touch()
    subprocess.run(["mount", "--bind", netns, str(keep)], check=True)
    name = os.path.basename(netns)
    try:
        subprocess.run(["ip", "netns", "del", name], check=True)
        if reused:
            subprocess.run(["ip", "netns", "add", name], check=True)
        outs = [sb.cli("sweep", "--apply", "--orphans"), sb.status(), sb.cli("sweep", "--apply")]
        after = sb.residue(NET, cid, ips)
        served = _reach_at(sb, str(keep), "172.26.64.1", 8117, "still-here")
    finally:
        subprocess.run(["umount", str(keep)], check=False)
    assert after == before, ([o.stdout if hasattr(o, "stdout") else o for o in outs])
    assert served == "still-here"


# -- the scheduler's word and observe mode from every source ----------------------------------------------------
@pytest.fixture
def agent(tmp_path):
    from testkit.nomad_standin import serving_agent

    with serving_agent(tmp_path, "5d5ed6c4-7b4b-43a0-9b59-8d9b2f7a3c11") as a:
        yield a


@pytest.mark.parametrize("source", ["settings-top", "settings-network", "modes-file", "settings-unusable"])
def test_held_observe_from_any_source_removes_nothing_on_the_word(box, agent, source):
    """held. An allocation that Nomad's agent says is complete; observe said by the settings file's top level
    (no conflist: the CLI's bare run), by its `networks.<name>.mode`, only by the network's own calls (`.modes`,
    the CLI reading no conflist), or by a settings file that cannot be used (not a JSON object).
    `sweep --apply --nomad --nomad-remove-netns` removes nothing, not even the namespace."""
    import os
    import uuid

    sb = box
    cid, netns = str(uuid.uuid4()), sb.container()
    conf = sb.conflist(mode="observe") if source == "modes-file" else sb.conflist()
    ips = ips_of(sb.driver("add", cid, netns, ("8118:80/tcp",), conf))
    agent.allocation(cid, "complete")
    before = sb.snapshot(NET, cid, ips)
    settings = sb.root / "config.json"
    doc = {"settings-top": {"mode": "observe"}, "settings-network": {"networks": {NET: {"mode": "observe"}}},
           "modes-file": {}, "settings-unusable": ["mode", "observe"]}[source]
    settings.write_text(json.dumps(doc))
    argv = [str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--nomad", "--nomad-remove-netns", "--config",
            str(settings), "--cni-conf-dir", str(sb.root / "none"), "--log-file", str(sb.log_file)]
    out = sb.run(argv, env={"NOMAD_ADDR": agent.serving.address})
    assert os.path.exists(netns), out.stdout + out.stderr
    assert sb.snapshot(NET, cid, ips) == before, out.stdout + out.stderr


# -- a forming re-ADD and a libcni cache entry dated ahead -----------------------------------------------------
def _forming_re_add_with_a_cache_entry_dated_ahead(sb, port: int, same_address: bool = False):
    """X was added before cni-reaper was installed (a chain without it) and died with no DEL; its reservation
    went with a boot (host-local kept it in a tmpfs, Nomad 1.9.4+) and the clock had run ahead before (libcni's
    cache entry of X is dated a day in the future). Nomad adds X again (the same ID, a new netns) and that ADD
    is held after bridge, firewall and portmap (its reservation, rules and DNAT are there), before cni-reaper
    records it. Returns (held ADD, netns, X, the forming life's reservations, its rules)."""
    import os

    from testkit.sandbox import Held, add_stall_plugin

    plain, reaper = sb.conflist(without_reaper=True), sb.conflist()
    x = unique("skewed-")
    ips_of(sb.driver("add", x, sb.container(), (f"{port}:80/tcp",), plain))
    sb.reboot(tmpfs_dirs=("networks",))
    ahead = os.stat(sb.cni_dir).st_mtime + 86400
    for p in (sb.cni_dir / "results").iterdir():
        if x in p.name:
            os.utime(p, (ahead, ahead))
    if not same_address:  # a first ADD of this boot takes X's old address (and does its once-per-boot look)
        ips_of(sb.driver("add", unique("first-"), sb.container(), ("9001:80/tcp",), reaper))
    stalled, stall_dir = add_stall_plugin(sb, reaper)
    netns = sb.container()
    earlier = set(sb.tables().splitlines())  # the dead life's rules (restored by the boot) among them
    held = Held(sb, stalled, stall_dir, x, netns, (f"{port}:80/tcp",))
    held.wait()
    forming = {ip: o for ip, o in sb.reservations(NET).items() if o == x}
    assert forming
    rules = [l for l in sb.tables().splitlines() if not l.startswith(("#", ":", "*", "COMMIT"))
             and (l not in earlier or (same_address and (x in l or any(f" {ip}/" in l for ip in forming))))]
    assert rules
    return held, netns, x, forming, rules


@pytest.mark.parametrize("same_address", [False, True], ids=["new-address", "same-address"])
@pytest.mark.parametrize("looker", ["add-port-look", "sweep-orphans"])
def test_a_forming_re_add_is_not_proven_dead_by_a_cache_entry_dated_ahead(box, looker, same_address):
    """Promise: nothing a forming allocation holds is removed; dead only on positive evidence. X's re-ADD is in
    flight (reservation and rules made, record not yet written: see the helper) and libcni's cache entry of
    X's dead earlier life is dated ahead (the clock ran ahead before a boot). Then either another allocation's
    ADD maps X's host port (its look at who else maps it) or the operator runs `sweep --apply --orphans`
    with the conflist installed. Neither may remove X's new reservation or rules: the cache entry's time is
    no evidence that the reservation is the dead life's (judge/reservations.own with `not_after` = the entry's
    mtime, given by reap/orphans.judged; cached_dead already refuses that with not_after=-1).
    Reproduce: pytest -k test_a_forming_re_add_is_not_proven_dead_by_a_cache_entry_dated_ahead."""
    sb = box
    port = 8119
    held, _netns, x, forming, rules = _forming_re_add_with_a_cache_entry_dated_ahead(sb, port, same_address)
    try:
        if looker == "add-port-look":
            out = sb.driver("add", unique("newcomer-"), sb.container(), (f"{port}:80/tcp",))
            said = out.stderr
        else:
            conf_dir = sb.root / "net.d"
            conf_dir.mkdir(exist_ok=True)
            (conf_dir / "10-nomad.conflist").write_text(sb.conflist().read_text())
            out = sb.run([str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--orphans", "--network", NET,
                          "--cni-conf-dir", str(conf_dir)])
            said = out.stdout + out.stderr
        now_res = {ip: o for ip, o in sb.reservations(NET).items() if o == x}
        now = sb.tables()
        gone = [l for l in rules if l not in now]
    finally:
        done = held.release()
    assert now_res == forming, ("the re-ADD's reservation went", said)
    assert gone == [], ("rules of the re-ADD in flight were removed", gone, said)
    assert done.returncode == 0, done.stderr


# -- observe in the conflist, on a client that also wraps portmap -----------------------------------------------
@pytest.mark.parametrize("wrapped", [True, False], ids=["wrapped", "control-not-wrapped-held"])
@pytest.mark.parametrize("verb", ["add", "del"])
def test_observe_in_a_conflist_whose_portmap_is_wrapped_removes_nothing(box, verb, wrapped):
    """BREAK. Promise: observe from any source (here: cni-reaper's conflist entry) removes nothing anywhere.
    README: wrap mode and a conflist of one's own can run "side by side on one client"; with the wrapper
    directory first on cni_path, every conflist that chains portmap has its portmap wrapped, the shipped
    nomad-reaper.conflist included. That conflist's cni-reaper entry says "mode": "observe" (as "Trying it
    safely" asks); the settings file of wrapped networks says nothing of modes (clean by default). A dead
    allocation of nomad-reaper (netns gone, no DEL), then an ADD (or a DEL of another allocation) on
    nomad-reaper: its wrapped portmap's call notes the network `clean` in .modes and marks it wrapped, and its
    sweep removes the dead allocation's rules, reservation and record.
    Root cause: the wrapper's call writes conf.mode from the settings file (state/modes.network_modes ->
    remember_mode, `.wrapped`), and judge/modes.mode_of treats a network in `.wrapped` as not chained, so the
    conflist entry's observe (known only through `.modes`, overwritten) is lost to the verb passes."""
    from testkit.nomad import Client

    sb = box
    if wrapped:
        Client(sb)  # the wrapper directory first on the plugin path, CNI_REAPER_CONFIG with no mode
    observing = sb.conflist(mode="observe")
    cid, ips = _leak(sb, "8121:80/tcp", observing)
    before = sb.residue(NET, cid, ips)
    assert before
    other, ns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", other, ns, ("8122:80/tcp",), observing))
    if verb == "del":
        assert sb.driver("del", other, ns, ("8122:80/tcp",), observing).returncode == 0
    after = sb.residue(NET, cid, ips)
    modes = (sb.state_dir() / ".modes").read_text() if (sb.state_dir() / ".modes").exists() else None
    assert after == before, (modes, sb.record(cid) is not None)
