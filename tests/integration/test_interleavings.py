"""Safe at any moment: a sweep that meets an ADD in flight, allocations restored after a reboot at their old
paths (often with their old addresses) while other calls sweep, recreates in parallel, and the late DEL of
an allocation whose address went to a new one. Through go-cni with the reference plugins, both flavours.

An ADD is held in flight deterministically, not by timing: a test plugin placed just before cni-reaper
(testkit.sandbox.STALL_PLUGIN) stops once bridge, firewall and portmap have made the attachment's rules and
its reservation, until the test lets it go."""

from __future__ import annotations

import json
import re
import threading

import pytest

from testkit.sandbox import Held, Stack, add_stall_plugin, ips_of, open_sandbox, sh, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
TRIALS = 6


def cli(sb, *args):
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(sb.root / "no-conflists")])


ADDRESS = re.compile(r"(\d+\.\d+\.\d+\.\d+)(?:/32|:\d+)")


def lines_of(sb, cid: str, ips: list[str]) -> tuple[list[str], dict[str, str]]:
    """A life's lines in every table (its container's, but for those of another of its addresses: an earlier
    life's) and its reservations (address -> holder)."""
    lines = [l for l in sb.residue(NET, cid, ips) if all(a in ips for a in ADDRESS.findall(l))]
    return sorted(lines), {ip: who for ip, who in sb.reservations(NET).items() if ip in ips}


def held_ips(sb, cid: str) -> list[str]:
    return sorted(ip for ip, who in sb.reservations(NET).items() if who == cid)


SWEEPERS = ["cli-orphans", "cli", "status", "another-add"]


@pytest.mark.parametrize("sweeper", SWEEPERS)
def test_a_sweep_while_an_add_is_in_flight_takes_nothing_of_it(sb, sweeper):
    conflist, stall = add_stall_plugin(sb, sb.conflist())
    for trial in range(TRIALS):
        dead = unique("alloc-")
        ns_dead = sb.container()
        ips_dead = ips_of(sb.driver("add", dead, ns_dead, (f"{9000 + trial}:80/tcp",), conflist))
        sb.remove_container(ns_dead)  # something for the sweep to do
        cid, netns = unique("alloc-"), sb.container()
        held = Held(sb, conflist, stall, cid, netns, (f"{8000 + trial}:80/tcp", f"{8000 + trial}:80/udp"))
        held.wait()
        ips = held_ips(sb, cid)
        made = lines_of(sb, cid, ips)
        assert ips and made[0], "the reference plugins made nothing?"
        if sweeper == "cli-orphans":
            out = cli(sb, "sweep", "--apply", "--orphans")
        elif sweeper == "cli":
            out = cli(sb, "sweep", "--apply")
        elif sweeper == "status":
            out = sb.run([str(sb.plugin_dir / "cni-reaper")], env={"CNI_COMMAND": "STATUS", "CNI_PATH": str(sb.plugin_dir)},
                         input=json.dumps(sb.status_conf()))
        else:
            out = sb.driver("add", unique("alloc-"), sb.container(), (f"{7000 + trial}:80/tcp",), conflist)
        assert out.returncode in (0, 6), out.stdout + out.stderr
        assert lines_of(sb, cid, ips) == made, f"trial {trial}: the sweep took something of the ADD in flight"
        assert held.release().returncode == 0
        assert lines_of(sb, cid, ips) == made and sb.record(cid) is not None
        assert sb.residue(NET, dead, ips_dead) == []


def test_allocations_restored_after_a_reboot_are_never_taken_for_their_dead_lives(sb):
    """Nomad 1.9.4+ keeps host-local's reservations on tmpfs: after a reboot they are gone, the records and the
    restored rules are not, and allocations come back at the same netns paths, usually with their old
    addresses. One is held in flight while the others are restored (their sweeps run) and the CLI sweeps."""
    conflist, stall = add_stall_plugin(sb, sb.conflist())
    allocs = {unique("alloc-"): sb.container() for _ in range(4)}
    ports = {cid: (f"{8100 + i}:80/tcp",) for i, cid in enumerate(allocs)}
    for cid, netns in allocs.items():
        ips_of(sb.driver("add", cid, netns, ports[cid], conflist))
    for rnd in range(3):
        sb.reboot(tmpfs_dirs=("networks",))
        for netns in allocs.values():  # restored at the same paths
            sh("ip", "netns", "add", netns.rsplit("/", 1)[1])
            sb.containers.append(netns.rsplit("/", 1)[1])
        order = list(allocs)
        first = order[rnd % len(order)]
        held = Held(sb, conflist, stall, first, allocs[first], ports[first])
        held.wait()
        ips = held_ips(sb, first)
        made = lines_of(sb, first, ips)
        for cid in order:
            if cid != first:
                assert sb.driver("add", cid, allocs[cid], ports[cid], conflist).returncode == 0
                assert lines_of(sb, first, ips) == made, f"round {rnd}: {cid}'s ADD took the restored {first}"
        # 4: the record of the old life whose reservation an ADD in flight of the same container now holds stays,
        # held (settle obeys the verdict: issue 42, case 5), and the CLI says so
        assert cli(sb, "sweep", "--apply", "--orphans").returncode in (0, 4, 6)
        assert lines_of(sb, first, ips) == made, f"round {rnd}: the CLI took the restored {first}"
        assert held.release().returncode == 0
        assert lines_of(sb, first, ips) == made
        for i, (cid, netns) in enumerate(allocs.items()):
            assert held_ips(sb, cid), f"round {rnd}: {cid} has no reservation"
            assert sb.reach(netns, "172.26.64.1", 8100 + i, f"{cid}-{rnd}") == f"{cid}-{rnd}"


def test_recreates_in_parallel_all_succeed(tmp_path, flavour, package_exe):
    """Nomad 1.9.5+ after a client restart: CHECK fails for several allocations, each destroyed and re-added at
    the same path with no DEL, in parallel (other runtimes and the CLI do not share Nomad's lock): every
    STATUS waits for the state lock and releases its old life, so every recreate succeeds."""
    with open_sandbox(tmp_path, flavour, package_exe, Stack("1.9", "go-cni-1.1.13")) as nomad:
        allocs = {unique("alloc-"): nomad.container() for _ in range(6)}
        for i, (cid, netns) in enumerate(allocs.items()):
            ips_of(nomad.driver("add", cid, netns, (f"{8200 + i}:80/tcp",)))
        for rnd in range(3):
            for netns in allocs.values():
                name = netns.rsplit("/", 1)[1]
                sh("ip", "netns", "del", name)
                sh("ip", "netns", "add", name)
            results: dict[str, int] = {}

            def recreate(cid: str, netns: str, port: int, results: dict[str, int] = results) -> None:
                results[cid] = nomad.driver("add", cid, netns, (f"{port}:80/tcp",)).returncode

            threads = [threading.Thread(target=recreate, args=(cid, netns, 8200 + i))
                       for i, (cid, netns) in enumerate(allocs.items())]
            sweeper = threading.Thread(target=lambda: cli(nomad, "sweep", "--apply", "--orphans"))
            for t in [sweeper, *threads]:
                t.start()
            for t in [sweeper, *threads]:
                t.join()
            assert results == {cid: 0 for cid in allocs}, f"round {rnd}: {results}"
            for i, (cid, netns) in enumerate(allocs.items()):
                assert nomad.reach(netns, "172.26.64.1", 8200 + i, cid) == cid


def test_a_late_del_of_a_dead_allocation_leaves_the_new_owner_of_its_address_alone(sb):
    """The dead allocation's address is released by cni-reaper and given to a new allocation; then the
    runtime sends the dead one's DEL, with the result libcni cached for it. The firewall plugin deletes the
    CNI-FORWARD rules of every address in that result: cni-reaper took the released address out of it."""
    conflist = sb.conflist(bridge="late0", subnet="172.29.0.0/24")
    data = json.loads(conflist.read_text())
    for p in data["plugins"]:
        if p["type"] == "bridge":  # one address: the next allocation gets the dead one's
            p["ipam"]["ranges"] = [[{"subnet": "172.29.0.0/24", "rangeStart": "172.29.0.9", "rangeEnd": "172.29.0.9"}]]
    conflist.write_text(json.dumps(data))
    dead, new = unique("alloc-"), unique("alloc-")
    ns_dead, ns_new = sb.container(), sb.container()
    [ip] = ips_of(sb.driver("add", dead, ns_dead, ("8300:80/tcp",), conflist))
    sb.remove_container(ns_dead)
    swept = cli(sb, "sweep", "--apply")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert ips_of(sb.driver("add", new, ns_new, ("8301:80/tcp",), conflist)) == [ip]
    before = lines_of(sb, new, [ip])
    assert any(l.startswith("-A CNI-FORWARD") for l in before[0]) and before[1] == {ip: new}
    late = sb.driver("del", dead, ns_dead, ("8300:80/tcp",), conflist)
    assert late.returncode == 0, late.stderr
    assert lines_of(sb, new, [ip]) == before
    assert [l for l in sb.residue(NET, dead, []) if dead in l] == []
    assert sb.reach(ns_new, "172.29.0.1", 8301, "new owner") == "new owner"
