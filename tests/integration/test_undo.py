"""Trust before authority: observe mode removes nothing and says what it would; every clean-up is journaled and
`cni-reaper undo` puts it back exactly, unless something live now holds it. Through go-cni with the
reference plugins (1.9 for the native nftables tables), both iptables flavours."""

from __future__ import annotations

import json
import re

import pytest

from testkit.sandbox import Held, HungNft, Stack, add_stall_plugin, flavour_bin_dir, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
PORTS = ("8080:80/tcp", "8080:80/udp")
NOMAD = Stack("1.9", "go-cni-1.1.13")


def cli(sb, *args):
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(sb.root / "none")])


def native(sb) -> list[str]:
    return sorted(re.sub(r" # handle \d+", "", l) for l in sb.native_rules())


def reservations(sb) -> dict[str, str]:
    out = {}
    for p in sorted(sb.cni_dir.glob(f"*/{NET}/*")) + sorted(sb.run_cni.glob(f"{NET}/*")):
        if p.name[0].isdigit():
            out[str(p)] = p.read_text()
    return out


def state(sb) -> tuple:
    return sb.normalized_tables(), native(sb), reservations(sb)


def kill_and_clean(sb, how: str, conflist, cid: str, netns: str, live: str) -> tuple[str, list[str]] | None:
    """The attachment dies (its netns removed; with "del" the runtime's DEL comes then) and is cleaned by
    `how`; the allocation of an ADD that swept, if any."""
    sb.remove_container(netns)
    if how == "del":
        assert sb.driver("del", cid, netns, PORTS, conflist).returncode == 0
    elif how == "add":
        newcomer = unique("alloc-")
        return newcomer, ips_of(sb.driver("add", newcomer, sb.container(), ("9090:80/tcp",), conflist))
    elif how == "status":
        rc, out, err = sb.status()
        assert rc == 0, (out, err)
    elif how == "gc":
        assert sb.driver("gc", conflist=conflist, valid=(f"{live}:eth0",)).returncode == 0
    else:
        assert cli(sb, "sweep", "--apply").returncode == 0
    return None


def without(sb, st: tuple, newcomer: tuple[str, list[str]] | None) -> tuple:
    if newcomer is None:
        return st
    cid, ips = newcomer
    mine = set(sb.residue(NET, cid, ips)) | {l for l in st[1] if cid in l or any(f"{ip} " in l for ip in ips)}
    return ([l for l in st[0] if l not in mine], [l for l in st[1] if l not in mine],
            {k: v for k, v in st[2].items() if cid not in v})


def swept_dead(sb, conflist, ports=None) -> tuple[str, list[str]]:
    """An allocation added, its netns removed, and swept by the operator: its container ID and addresses."""
    cid, ns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, ns, PORTS if ports is None else ports, conflist))
    sb.remove_container(ns)
    assert cli(sb, "sweep", "--apply").returncode == 0
    return cid, ips


CLEANERS = ["del", "add", "status", "cli"]


@pytest.fixture(params=["iptables", "native"])
def setup(request, tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conflist = sb.native_conflist() if request.param == "native" else sb.conflist()
        yield sb, conflist, request.param


@pytest.mark.parametrize("how", [*CLEANERS, "gc"])
def test_undo_puts_back_exactly_what_a_clean_up_removed(setup, how):
    sb, conflist, kind = setup
    cid, netns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    other, other_ns = unique("alloc-"), sb.container()  # a live neighbour: undo leaves it as it is
    ips_of(sb.driver("add", other, other_ns, ("8081:80/tcp",), conflist))
    before = state(sb)
    record = sb.record(cid)
    newcomer = kill_and_clean(sb, how, conflist, cid, netns, other)
    after_clean = state(sb)
    assert without(sb, after_clean, newcomer) != before and sb.record(cid) is None, "nothing was cleaned"
    journaled = json.loads(cli(sb, "journal", cid, "--json").stdout)
    kinds = {e["kind"] for e in journaled}
    assert {"reservation", "record", "nft" if kind == "native" else "iptables"} <= kinds, kinds
    # the native rules and the record as they were read (their text written as it is, jsonio.Raw): each rule
    # with the handle nft printed, which undo leaves out when it adds the rule back
    assert all("handle" in e["item"]["rule"] for e in journaled if e["kind"] == "nft")
    assert [e["item"]["record"] for e in journaled if e["kind"] == "record"] == [record]
    dry = cli(sb, "undo", cid, "--dry-run")
    assert "would put back" in dry.stdout and state(sb) == after_clean
    out = cli(sb, "undo", cid)
    refused = [l for l in out.stdout.splitlines() if l.startswith("not put back")]
    # a DEL that went through: libcni forgot the attachment, rightly; nothing else may stand in the way
    assert all(how == "del" and "libcni no longer caches" in l for l in refused), out.stdout + out.stderr
    assert without(sb, state(sb), newcomer) == before
    back = sb.record(cid)
    assert back is not None and back["current"] == record["current"]
    restored = state(sb)
    again = cli(sb, "undo", cid)
    assert again.returncode == 0 and "nothing of" in again.stdout and state(sb) == restored


def test_undo_refuses_what_a_live_allocation_holds_now(tmp_path, flavour, package_exe):
    """The dead attachment's address and host port went to a new allocation: undo puts back none of what
    would overwrite or shadow it, and says why."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conflist = sb.conflist(bridge="undo0", subnet="172.30.0.0/24")
        data = json.loads(conflist.read_text())
        for p in data["plugins"]:
            if p["type"] == "bridge":
                p["ipam"]["ranges"] = [[{"subnet": "172.30.0.0/24", "rangeStart": "172.30.0.7", "rangeEnd": "172.30.0.7"}]]
        conflist.write_text(json.dumps(data))
        dead, new = unique("alloc-"), unique("alloc-")
        ns_dead, ns_new = sb.container(), sb.container()
        [ip] = ips_of(sb.driver("add", dead, ns_dead, PORTS, conflist))
        sb.remove_container(ns_dead)
        assert cli(sb, "sweep", "--apply").returncode == 0
        assert ips_of(sb.driver("add", new, ns_new, PORTS, conflist)) == [ip]  # its address and its port
        before = state(sb)
        out = cli(sb, "undo", dead)
        assert out.returncode == 4, out.stdout + out.stderr
        assert f"{ip} is reserved by {new}" in out.stdout or f"{ip} is held by" in out.stdout
        assert "host port 8080" in out.stdout or f"{ip} is held by" in out.stdout
        now = state(sb)
        assert set(now[0]) ^ set(before[0]) == set() and now[1:] == before[1:], (set(now[0]) - set(before[0]), out.stdout)
        assert sb.reach(ns_new, "172.30.0.1", 8080, "the new one") == "the new one"
        # nor libcni's cached result naming the address again (red team): the runtime hands it to the dead
        # one's late DEL, whose firewall and portmap would then remove the new one's rules
        assert any(l.startswith("not put back") and "cached result" in l for l in out.stdout.splitlines()), out.stdout
        assert sb.driver("del", dead, ns_dead, PORTS, conflist).returncode == 0
        assert sb.residue(NET, new, [ip]) and set(state(sb)[0]) == set(before[0]), set(before[0]) - set(state(sb)[0])
        assert sb.reach(ns_new, "172.30.0.1", 8080, "the new one") == "the new one"


def test_a_damaged_journal_puts_back_nothing_of_a_damaged_item_and_says_so(tmp_path, flavour, package_exe):
    """Fields of journaled items damaged (wrong types, missing, a path for an address): undo says which entry
    is damaged and puts back the sound ones, never a traceback, nothing outside its directories."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conflist = sb.conflist()
        cid, _ = swept_dead(sb, conflist)
        journal = sb.state_dir() / ".journal"
        intact = journal.read_text()
        damages = {"index": "two", "spec": None, "rules": "abc", "content": 5, "ip": "../../..", "family": 99}
        for field, value in damages.items():
            events = [json.loads(l) for l in intact.splitlines()]
            hit = False
            for e in events:
                for item in e.get("items") or []:
                    if field in item and not hit:
                        item[field], hit = value, True
                if e.get("t") == "intent":
                    e["at"] = "yesterday"
            assert hit, field
            journal.write_text("".join(json.dumps(e) + "\n" for e in events))
            shown = cli(sb, "journal", cid)
            out = cli(sb, "undo", cid, "--dry-run")
            for proc in (shown, out):
                assert proc.returncode in (0, 4) and "Error" not in proc.stderr and "Traceback" not in proc.stderr, (
                    field, proc.stdout, proc.stderr)
            assert "damaged" in out.stdout, (field, out.stdout)
        journal.write_text(intact)
        assert not list(sb.root.glob("**/..*")), "nothing written outside"


def test_observe_mode_removes_nothing_says_what_it_would_and_clean_mode_then_removes_it(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        watching = sb.conflist(mode="observe")
        cid, netns = unique("alloc-"), sb.container()
        ips = ips_of(sb.driver("add", cid, netns, PORTS, watching))
        sb.remove_container(netns)
        before = state(sb)
        for _ in range(3):  # the STATUS of each call sweeps: once is what is said
            assert sb.driver("add", unique("alloc-"), sb.container(), (), watching).returncode == 0
        assert [l for l in sb.residue(NET, cid, ips)] and reservations(sb).keys() >= {k for k in before[2] if cid in before[2][k]}
        lines = [json.loads(l) for l in sb.log_file.read_text().splitlines()]
        would = [l for l in lines if l["msg"] == "would remove" and l["containerID"] == cid]
        assert len(would) == 1 and not [l for l in lines if l["msg"] == "removed" and l.get("containerID") == cid]
        assert "is gone" in would[0]["why"] or "another namespace" in would[0]["why"], would[0]  # why it is dead
        assert json.loads(cli(sb, "list", "--json").stdout)[0]["state"] in ("dead", "live")
        metrics = cli(sb, "metrics", "--state-dir", "/var/lib/cni/reaper").stdout
        assert re.search(rf'cni_reaper_would_remove_total{{network="{NET}",kind="masquerade"}} [1-9]', metrics), metrics
        # back to clean: the next call removes exactly what was said
        cleaning = sb.conflist(mode="clean")
        assert sb.driver("add", unique("alloc-"), sb.container(), (), cleaning).returncode == 0
        assert sb.residue(NET, cid, ips) == []
        lines = [json.loads(l) for l in sb.log_file.read_text().splitlines()]
        [removed] = [l for l in lines if l["msg"] == "removed" and l["containerID"] == cid]
        assert sorted(removed["items"]) == sorted(would[0]["items"])


# -- observe mode across the reconcile scenarios ---------------------------------------------------------
SCENARIOS = ["del-after-netns-gone", "died-without-del", "died-without-del-native", "reboot-with-restored-rules",
             "gc"]


def play(sb, conflist, scenario: str, a: str, b: str) -> None:
    """One reconcile scenario of the suite, allocation `a` the one that dies; `b` a second allocation."""
    ns_a = sb.container()
    assert sb.driver("add", a, ns_a, PORTS, conflist).returncode == 0
    if scenario == "reboot-with-restored-rules":
        sb.reboot()
    else:
        sb.remove_container(ns_a)
    if scenario == "del-after-netns-gone":
        assert sb.driver("del", a, ns_a, PORTS, conflist).returncode == 0
        return
    ns_b = sb.container()
    assert sb.driver("add", b, ns_b, PORTS if scenario != "gc" else ("8090:80/tcp",), conflist).returncode == 0
    if scenario == "gc":
        assert sb.driver("gc", conflist=conflist, valid=(f"{b}:eth0",)).returncode == 0


def items_of(sb, msg: str, cid: str) -> list[list[str]]:
    return [l["items"] for l in map(json.loads, sb.log_file.read_text().splitlines())
            if l["msg"] == msg and l.get("containerID") == cid] if sb.log_file.exists() else []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_observe_mode_across_the_reconcile_scenarios(tmp_path, flavour, package_exe, two_stacks, scenario):
    """Each scenario three times, with the same allocations: without cni-reaper, with it observing, with it
    cleaning. Observing leaves the tables (native ones too) and the reservations exactly as the reference
    plugins alone leave them; its "would remove" names exactly what cleaning removes; and switched back to
    clean, the next call removes what of that is left."""
    if scenario == "gc" and not two_stacks.status:
        pytest.skip("GC is sent by libcni 1.3 (go-cni 1.1.13) only")
    if scenario.endswith("native") and two_stacks.plugins == "1.1.1":
        pytest.skip("native nftables tables: plugins 1.6 and later")
    a, b = unique("alloc-"), unique("alloc-")
    states, would, removed = {}, [], []
    for mode in ("plain", "observe", "clean"):
        with open_sandbox(tmp_path / mode, flavour, package_exe, two_stacks) as sb:
            make = sb.native_conflist if scenario.endswith("native") else sb.conflist
            conflist = make(without_reaper=True) if mode == "plain" else make(mode=mode)
            play(sb, conflist, scenario.removesuffix("-native"), a, b)
            tables, native_rules, held = state(sb)
            states[mode] = (tables, native_rules, {k.replace(str(sb.root), ""): v for k, v in held.items()})
            if mode == "clean":
                removed = sorted(i for batch in items_of(sb, "removed", a) for i in batch)
            if mode == "observe":
                observed = items_of(sb, "would remove", a)
                assert observed and not items_of(sb, "removed", a), scenario
                would = sorted(observed[0])
                # back to clean: the next call removes what of it is still there (on a DEL the downstream
                # plugins remove some themselves), and nothing of `a` is left
                assert sb.driver("add", unique("alloc-"), sb.container(), (), make(mode="clean")).returncode == 0
                assert set(i for batch in items_of(sb, "removed", a) for i in batch) <= set(would)
                assert [l for l in sb.residue(NET, a, []) + sb.native_rules() if a in l] == []
    assert states["observe"] == states["plain"], scenario
    assert would == removed, (would, removed)


def test_what_was_journaled_twice_is_put_back_once(setup):
    """A clean-up killed between its intent and its removals leaves an intent that the next clean-up writes
    again, item for item (found by test_crash.py's journal trials): undo puts each rule back once."""
    sb, conflist, _ = setup
    cid, netns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    before = state(sb)
    kill_and_clean(sb, "status", conflist, cid, netns, "")
    journal = sb.state_dir() / ".journal"
    events = [json.loads(l) for l in journal.read_text().splitlines()]
    twice = [dict(e, id=e["id"] + "-cut") for e in events if e["t"] == "intent"]  # no done: "perhaps removed"
    journal.write_text("".join(json.dumps(e) + "\n" for e in twice + events))
    out = cli(sb, "undo", cid)
    assert out.returncode == 0, out.stdout + out.stderr
    assert state(sb)[:2] == before[:2], out.stdout
    again = cli(sb, "undo", cid)
    assert "nothing of" in again.stdout and state(sb)[:2] == before[:2]


def test_undo_puts_back_every_record_of_a_container(tmp_path, flavour, package_exe):
    """One container on two networks (a red team's case): both records come back, not the newest alone."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        a = sb.conflist(name="net-a", bridge="rta0", subnet="10.71.0.0/24")
        b = sb.conflist(name="net-b", bridge="rtb0", subnet="10.72.0.0/24")
        cid, netns, netns2 = unique("alloc-"), sb.container(), sb.container()
        ips_of(sb.driver("add", cid, netns, (), a))
        ips_of(sb.driver("add", cid, netns2, (), b))
        before = sorted(json.dumps(r, sort_keys=True) for r in sb.records() if r["containerID"] == cid)
        assert len(before) == 2
        sb.remove_container(netns)
        sb.remove_container(netns2)
        assert cli(sb, "sweep", "--apply").returncode == 0
        assert not [r for r in sb.records() if r["containerID"] == cid]
        out = cli(sb, "undo", cid)
        after = sorted(json.dumps(r, sort_keys=True) for r in sb.records() if r["containerID"] == cid)
        assert after == before, out.stdout


def _single_addresses(conflist, v4: str, v6: str) -> None:
    """Each family's range cut to one address: the next allocation gets the dead one's addresses."""
    data = json.loads(conflist.read_text())
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["ipam"]["ranges"] = [[{"subnet": v4.rsplit(".", 1)[0] + ".0/24", "rangeStart": v4, "rangeEnd": v4}],
                                   [{"subnet": v6.rsplit(":", 1)[0] + ":/64", "rangeStart": v6, "rangeEnd": v6}]]
    conflist.write_text(json.dumps(data))


@pytest.mark.parametrize("taken", ["addresses", "host port"])
def test_undo_puts_back_no_native_rule_a_live_allocation_holds_or_that_would_shadow_it(tmp_path, flavour, package_exe,
                                                                                          taken):
    """Issue 32, cases 1 and 2 (plugins 1.9, native nftables backends, dual stack): a dead allocation cleaned,
    then a live one that holds its IPv4 and IPv6 addresses now (on another host port), or that maps its host
    port now (on other addresses). Undo of the dead one puts back none of its native rules that name the live
    one's addresses (its masquerade is the live one's rule only by its comment) or that map the live one's
    host port, and says why; the live one's traffic still reaches it. 0.4.0 put back the IPv6 DNAT to the
    live address (its holder check read IPv4 only) and every DNAT of a host port mapped again."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conflist = sb.native_conflist("nomad-reaper-dualstack.conflist")
        if taken == "addresses":
            _single_addresses(conflist, "172.26.64.9", "fd00:a:26::9")
        dead, live = unique("alloc-"), unique("alloc-")
        ns_dead, ns_live = sb.container(), sb.container()
        dead_ips = ips_of(sb.driver("add", dead, ns_dead, PORTS, conflist))
        sb.remove_container(ns_dead)
        assert cli(sb, "sweep", "--apply").returncode == 0
        assert not [l for l in native(sb) if dead in l]
        live_ports = ("8081:80/tcp", "8081:80/udp") if taken == "addresses" else PORTS
        live_ips = ips_of(sb.driver("add", live, ns_live, live_ports, conflist))
        assert (set(live_ips) == set(dead_ips)) == (taken == "addresses"), (live_ips, dead_ips)
        assert any(":" in ip for ip in live_ips), live_ips
        before = state(sb)
        out = cli(sb, "undo", dead)
        assert out.returncode == 4, out.stdout + out.stderr
        back = set(state(sb)[1]) - set(before[1])
        # what names a live address, or maps a live host port, stays out; the dead one's masquerade of an
        # address nobody holds may come back (it shadows nothing)
        assert not [l for l in back if taken == "addresses" or "dport" in l], (back, out.stdout)
        assert set(before[1]) <= set(state(sb)[1])
        refused = [l for l in out.stdout.splitlines() if l.startswith("not put back")]
        assert refused and not [l for l in out.stdout.splitlines() if "already there" in l], out.stdout
        why = "is held by" if taken == "addresses" else "host port 8080"
        assert any(why in l for l in refused), out.stdout
        v4 = next(ip for ip in live_ips if ":" not in ip)
        port = 8081 if taken == "addresses" else 8080
        assert sb.reach(ns_live, v4.rsplit(".", 1)[0] + ".1", port, "the live one") == "the live one"


def test_undo_judges_and_puts_back_under_host_locals_locks(tmp_path, flavour, package_exe):
    """An address given away while undo looks: undo holds host-local's lock of the network from its look at who
    holds what to its last put-back, so an allocation that takes the dead one's address meanwhile is seen, and
    nothing of that address comes back. Here the test holds the lock first, lets undo wait on it, gives the
    address away (as host-local would, under the lock) and lets go."""
    import fcntl
    import os
    import time

    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conflist = sb.conflist()
        dead, [ip] = swept_dead(sb, conflist)
        before = state(sb)
        network_dir = next(p for p in sb.cni_dir.glob(f"*/{NET}") if (p / "lock").exists())
        lock = os.open(network_dir / "lock", os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            proc = sb.popen([str(sb.plugin_dir / "cni-reaper"), "undo", dead, "--cni-conf-dir", str(sb.root / "none")])
            deadline = time.monotonic() + 60
            while not _has_open(proc.pid, f"{NET}/lock"):  # undo is waiting for the lock
                assert proc.poll() is None and time.monotonic() < deadline, "undo did not wait for host-local's lock"
                time.sleep(0.01)
            (network_dir / ip).write_text("alloc-newcomer\r\neth0")
        finally:
            os.close(lock)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, out + err
        assert f"{ip} is reserved by alloc-newcomer" in out or f"{ip} is held by alloc-newcomer" in out, out
        back = set(state(sb)[0]) - set(before[0])
        assert not [l for l in back if ip in l], back


def _has_open(pid: int, suffix: str) -> bool:
    import os

    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith(suffix) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_something_not_host_locals_at_a_reservations_name_is_said_never_a_traceback(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conflist = sb.conflist()
        dead, [ip] = swept_dead(sb, conflist, ())
        network_dir = next(p for p in sb.cni_dir.glob(f"*/{NET}") if (p / "lock").exists())
        (network_dir / ip).mkdir()
        before = sb.tables()
        out = cli(sb, "undo", dead)
        assert out.returncode == 4 and "Error" not in out.stderr, out.stdout + out.stderr
        # who holds the address is not known (the sweep's answer too): neither the reservation nor a rule of it
        assert f"{ip} has something at its host-local reservation's name that cannot be read" in out.stdout, out.stdout
        assert not [l for l in set(sb.tables().splitlines()) - set(before.splitlines()) if ip in l]


# -- red team of the holder check: other worlds, other flavours, other data directories --------------------------
def _mapped_back(sb, tables_before: str, native_before: list[str], port: int) -> list[str]:
    added = (set(sb.tables().splitlines()) - set(tables_before.splitlines())) | (set(sb.native_rules()) - set(native_before))
    return sb.rules_naming_port(port, list(added))


@pytest.mark.parametrize("dead_world,live_world", [("iptables", "native"), ("native", "iptables")])
def test_undo_puts_back_no_mapping_of_a_host_port_another_world_maps_now(tmp_path, flavour, package_exe, dead_world,
                                                                         live_world):
    """A live allocation maps host port 8080 in one world (iptables, or the plugins' native tables); the dead one
    mapped it in the other. The kernel runs both worlds' nat hooks: undo must not put the dead mapping back
    (the first red team's finding: the port check read only the world it wrote into)."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        ipt = sb.conflist(name="net-ipt", bridge="rti0", subnet="10.81.0.0/24")
        nat = sb.native_conflist(name="nomad-reaper.conflist")
        data = json.loads(nat.read_text())
        data["name"] = "net-nat"
        for p in data["plugins"]:
            if p["type"] == "bridge":
                p["bridge"], p["ipam"]["ranges"] = "rtn0", [[{"subnet": "10.82.0.0/24"}]]
        nat.write_text(json.dumps(data))
        conf = {"iptables": ipt, "native": nat}
        ips_of(sb.driver("add", unique("alloc-"), sb.container(), ("9999:80/tcp",), conf[live_world]))
        dead, live, ns_dead, ns_live = unique("alloc-"), unique("alloc-"), sb.container(), sb.container()
        ips_of(sb.driver("add", dead, ns_dead, ("8080:80/tcp",), conf[dead_world]))
        sb.remove_container(ns_dead)
        assert cli(sb, "sweep", "--apply").returncode == 0
        [lip] = ips_of(sb.driver("add", live, ns_live, ("8080:80/tcp",), conf[live_world]))
        gw = lip.rsplit(".", 1)[0] + ".1"
        tables, native_rules = sb.tables(), sb.native_rules()
        out = cli(sb, "undo", dead)
        assert out.returncode == 4 and "host port 8080/tcp is mapped by another allocation now" in out.stdout, out.stdout
        assert _mapped_back(sb, tables, native_rules, 8080) == [], out.stdout
        assert sb.reach(ns_live, gw, 8080, "the live one") == "the live one"


@pytest.mark.parametrize("dead_flavour,live_flavour", [("legacy", "nft"), ("nft", "legacy")])
def test_undo_puts_back_no_mapping_of_a_host_port_the_other_flavour_maps_now(tmp_path, package_exe, dead_flavour,
                                                                             live_flavour):
    """The same across iptables flavours (a host whose iptables alternative changed): the dead allocation's
    DNAT was made with one flavour, the live one's with the other."""
    with open_sandbox(tmp_path, live_flavour, package_exe, NOMAD) as sb:
        a = sb.conflist(name="net-a", bridge="rta0", subnet="10.91.0.0/24")
        b = sb.conflist(name="net-b", bridge="rtb0", subnet="10.92.0.0/24")
        ips_of(sb.driver("add", unique("alloc-"), sb.container(), ("9999:80/tcp",), b))
        sb.extra_env["PATH"] = f"{flavour_bin_dir(tmp_path, dead_flavour)}:/usr/sbin:/usr/bin:/sbin:/bin"
        dead, live, ns_dead, ns_live = unique("alloc-"), unique("alloc-"), sb.container(), sb.container()
        ips_of(sb.driver("add", dead, ns_dead, ("8080:80/tcp",), a))
        sb.remove_container(ns_dead)
        assert cli(sb, "sweep", "--apply").returncode == 0
        sb.extra_env.pop("PATH")
        [lip] = ips_of(sb.driver("add", live, ns_live, ("8080:80/tcp",), b))
        out = cli(sb, "undo", dead)
        assert out.returncode == 4 and "host port 8080/tcp is mapped by another allocation now" in out.stdout, out.stdout
        assert sb.reach(ns_live, lip.rsplit(".", 1)[0] + ".1", 8080, "the live one") == "the live one"


@pytest.mark.parametrize("forming", [True, False], ids=["forming", "live-without-reaper"])
def test_undo_sees_a_reservation_in_any_data_directory_host_local_may_use(tmp_path, flavour, package_exe, forming):
    """The dead one's address went to an attachment whose host-local keeps it in /var/run/cni (Nomad 1.9.4+'s
    bridge), that cni-reaper has no record of: one still forming (stopped after portmap, before cni-reaper), or
    one of a chain without cni-reaper. Undo puts back nothing of that address (the first red team's finding:
    it read only the conflists' data directories)."""
    def one_address(path, data_dir=None):
        data = json.loads(path.read_text())
        for p in data["plugins"]:
            if p["type"] == "bridge":
                p["ipam"]["ranges"] = [[{"subnet": "172.30.0.0/24", "rangeStart": "172.30.0.7", "rangeEnd": "172.30.0.7"}]]
                if data_dir:
                    p["ipam"]["dataDir"] = data_dir
        path.write_text(json.dumps(data))
        return path

    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        old = one_address(sb.conflist(bridge="undo0"))
        dead, ns_dead = unique("alloc-"), sb.container()
        [ip] = ips_of(sb.driver("add", dead, ns_dead, PORTS, old))
        sb.remove_container(ns_dead)
        assert cli(sb, "sweep", "--apply").returncode == 0
        new = one_address(sb.conflist(path=old, without_reaper=not forming), "/var/run/cni")
        live, ns_live = unique("alloc-"), sb.container()
        held = None
        if forming:
            stalled, stall_dir = add_stall_plugin(sb, new)
            held = Held(sb, stalled, stall_dir, live, ns_live, ("9090:80/tcp",))
            held.wait()
        else:
            assert ips_of(sb.driver("add", live, ns_live, ("9090:80/tcp",), new)) == [ip]
        before = set(sb.tables().splitlines())
        out = cli(sb, "undo", dead)
        back = sorted(l for l in set(sb.tables().splitlines()) - before if ip in l)
        if held:
            assert held.release().returncode == 0
        assert out.returncode == 4 and back == [], (back, out.stdout)
        assert not (sb.cni_dir / "networks" / "nomad-reaper" / ip).exists(), out.stdout
        assert sb.record(dead) is None or not forming, "the dead record naming a forming attachment's address came back"


def test_a_tool_that_hangs_while_undo_holds_host_locals_locks_is_stopped_at_the_clean_ups_bound(tmp_path, flavour,
                                                                                                package_exe):
    """Undo holds host-local's lock of every network it may touch from its look to its last put-back, and
    every allocation of those networks waits for it: an `nft` that hangs meanwhile is stopped within the time
    a clean-up has under those locks (files.holding), and what it would have said is not known, so nothing
    that maps a host port is put back and undo says why; another allocation's ADD beside it succeeds."""
    with open_sandbox(tmp_path, flavour, package_exe, NOMAD) as sb:
        conflist = sb.conflist()
        dead, _ = swept_dead(sb, conflist)
        hung = HungNft(sb)
        out, beside = hung.beside(
            lambda: sb.run([str(sb.plugin_dir / "cni-reaper"), "undo", dead, "--cni-conf-dir", str(sb.root / "none")],
                           env={"PATH": hung.path}),
            lambda: sb.driver("add", unique("beside-"), sb.container(), (), conflist))
        assert beside.returncode == 0, beside.stderr
        assert "cni-reaper may hold its state lock" in out.stdout, out.stdout + out.stderr
        assert not [l for l in sb.tables().splitlines() if "8080" in l and dead in l], out.stdout
