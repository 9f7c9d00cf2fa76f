"""Death is a finding, not an absence (docs/how-it-works.md, "Evidence"): through go-cni with the reference plugins 1.1.1 and
1.9, on both iptables flavours, a view of the host that cannot see (a libcni cache that is empty, missing or
another runtime's; a netns directory hidden by a tmpfs or by a private mount namespace; /proc not mounted;
another network namespace) removes nothing of a live attachment (its lines in every table and its
reservation stay byte-identical), the CLI exits 6 naming what it cannot see and doctor reports it; from a
complete view the same sweep removes the dead attachment's leftovers. A netns made again at the same path
with a recycled inode is another life. Two networks with different settings sharing a state directory are
each cleaned with their own. A symlinked ipamDataDir is followed as host-local follows it."""

from __future__ import annotations

import json
import os
import time

import pytest

from testkit.sandbox import ips_of, sh, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
PLAIN = "nomad"  # a network without cni-reaper in its chain, as Nomad's own bridge network is


def cli(sb, *args, pre: str = "", prefix: tuple[str, ...] = ()):
    """The CLI as an operator runs it on the client (no conflist: defaults and flags); `prefix` (e.g. nsenter)
    runs first, then the shell commands `pre`, then the CLI."""
    argv = [str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(sb.root / "no-conflists")]
    if pre:
        argv = ["sh", "-c", f'{pre} && exec "$@"', "sh", *argv]
    return sb.run([*prefix, *argv])


def plain_conflist(sb):
    """A network without cni-reaper (another bridge and subnet than the reaper network's)."""
    return sb.conflist(without_reaper=True, name=PLAIN, bridge="plain0", subnet="172.27.0.0/24")


def two_allocations(sb, conflist=None):
    """A live allocation and one that died without a DEL (its netns removed): (live, dead), each (cid, ips, netns)."""
    live, dead = unique("alloc-"), unique("alloc-")
    ns_live, ns_dead = sb.container(), sb.container()
    ips_live = ips_of(sb.driver("add", live, ns_live, ("8080:80/tcp", "8080:80/udp"), conflist))
    ips_dead = ips_of(sb.driver("add", dead, ns_dead, ("8081:80/tcp", "8081:80/udp"), conflist))
    sb.remove_container(ns_dead)
    return (live, ips_live, ns_live), (dead, ips_dead, ns_dead)


# -- libcni's cache: a missing, empty or foreign one proves nothing ------------------------------------
@pytest.mark.parametrize("cache", ["empty", "missing", "another-runtimes"])
def test_orphans_are_judged_only_by_a_cache_entry_that_proves_them_dead(sb, cache):
    conflist = plain_conflist(sb)
    (live, ips_live, _), (dead, ips_dead, _) = two_allocations(sb, conflist)
    before_live, before_dead = sb.snapshot(PLAIN, live, ips_live), sb.snapshot(PLAIN, dead, ips_dead)
    assert before_live[0] and before_live[1] and before_dead[0]
    where = sb.root / f"cache-{cache}"
    if cache != "missing":
        (where / "results").mkdir(parents=True)
    if cache == "another-runtimes":
        (where / "results" / "podman-abc-eth0").write_text('{"kind": "cniCacheV1", "containerId": "abc"}')
    blind = cli(sb, "sweep", "--apply", "--orphans", "--cni-cache-dir", str(where))
    assert blind.returncode == 6, blind.stdout + blind.stderr
    assert "cannot judge" in blind.stderr and ("libcni" in blind.stderr or "cache" in blind.stderr)
    assert sb.snapshot(PLAIN, live, ips_live) == before_live
    assert sb.snapshot(PLAIN, dead, ips_dead) == before_dead  # no evidence either way: left, with the reason
    doctor = json.loads(cli(sb, "doctor", "--json", "--cni-cache-dir", str(where)).stdout)
    if cache == "missing":
        assert any(f["check"] == "cni-cache" and f["status"] == "WARN" for f in doctor["findings"])
    # from the runtime's own cache: the dead one is proven dead (its cached netns is gone), the live one is not
    seen = cli(sb, "sweep", "--apply", "--orphans")
    assert seen.returncode == 0, seen.stdout + seen.stderr
    assert sb.snapshot(PLAIN, live, ips_live) == before_live
    assert sb.residue(PLAIN, dead, ips_dead) == []


# -- a view of the netns directories or of /proc that cannot see -------------------------------------
VIEWS = {
    # a tmpfs over the netns directory: paths prove nothing here; veths still do (same network namespace)
    "tmpfs-over-netns-dir": ("mount -t tmpfs none /run/netns", False),
    # a private copy of the mount tree that no longer receives new mounts, in another network namespace
    "private-copy-elsewhere": ("mount --make-rprivate / && mount -t tmpfs none /run/netns", True),
    "no-proc": ("umount -l /proc", True),
    "another-network-namespace": ("", True),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_a_sweep_that_cannot_see_removes_nothing_of_a_live_attachment(sb, view):
    (live, ips_live, _), (dead, ips_dead, _) = two_allocations(sb)
    before_live, before_dead = sb.snapshot(NET, live, ips_live), sb.snapshot(NET, dead, ips_dead)
    pre, blind = VIEWS[view]
    prefix: tuple[str, ...] = ()
    if view in ("another-network-namespace", "private-copy-elsewhere"):
        other = sb.container()  # a network namespace that is not the attachments' host
        prefix = ("nsenter", f"--net={other}")
    out = cli(sb, "sweep", "--apply", pre=pre, prefix=prefix)
    assert sb.snapshot(NET, live, ips_live) == before_live, out.stdout + out.stderr
    if blind:
        assert out.returncode == 6, out.stdout + out.stderr
        assert "cannot judge" in out.stderr
        assert sb.snapshot(NET, dead, ips_dead) == before_dead  # nothing that depends on what it cannot see
        doctor = json.loads(cli(sb, "doctor", "--json", pre=pre, prefix=prefix).stdout)
        assert any(f["check"] in ("host-view", "dead-records") and f["status"] != "OK" for f in doctor["findings"])
        seen = cli(sb, "sweep", "--apply")  # from where the runtime runs
        assert seen.returncode == 0, seen.stdout + seen.stderr
    else:
        # the host side of the dead one's veth pair is gone, and that is seen from any mount namespace
        assert out.returncode == 0, out.stdout + out.stderr
    assert sb.residue(NET, dead, ips_dead) == []
    assert sb.snapshot(NET, live, ips_live) == before_live


def test_a_del_run_in_another_network_namespace_leaves_its_rules_to_a_sweep_that_reaches_them(sb):
    """A DEL whose process runs in another network namespace than the one the attachment was recorded in
    cannot reach its rules: its own clean-up is judged as any sweep's (sweep.judge: out of reach), removes
    nothing, and its tombstone asks for a second look; the sweep from the attachment's host then cleans it.
    (Before, the DEL "cleaned" the other namespace's tables, found nothing, called its clean-up finished,
    and the tombstone went with the rules still in the host's tables.)"""
    (live, ips_live, _), (dead, ips_dead, ns_dead) = two_allocations(sb)
    before_live, before_dead = sb.snapshot(NET, live, ips_live), sb.snapshot(NET, dead, ips_dead)
    data = json.loads(sb.conflist().read_text())
    conf = dict(next(p for p in data["plugins"] if p["type"] == "cni-reaper"), name=data["name"],
                cniVersion=data["cniVersion"])
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": dead, "CNI_NETNS": ns_dead, "CNI_IFNAME": "eth0",
           "CNI_PATH": f"{sb.plugin_dir}:{sb.plugins}"}
    other = sb.container()
    proc = sb.run(["nsenter", f"--net={other}", str(sb.plugin_dir / "cni-reaper")], env=env, input=json.dumps(conf))
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr
    assert "left for a sweep" in proc.stderr and "another network namespace" in proc.stderr, proc.stderr
    assert sb.snapshot(NET, dead, ips_dead) == before_dead
    assert sb.record(dead)["deleted"]["verify"] is True
    for cached in (sb.cni_dir / "results").glob(f"*{dead}*"):
        cached.unlink()  # as libcni does once the chain's DEL is done
    sb.status(name=NET)  # a verb from the attachments' host: the second look
    assert sb.residue(NET, dead, ips_dead) == []
    assert sb.snapshot(NET, live, ips_live) == before_live


# -- a netns made again at the same path, with the same (recycled) inode --------------------------------
def _remake_with_the_same_inode(sb, path: str, tries: int = 3000) -> None:
    """Delete the namespace at `path` and make another at the same path that the kernel gives the same inode
    number: namespaces get the lowest free number, so fill the numbers below it with throwaway ones (once
    the old one's clean-up has freed its number) until one gets it, then mount that one at `path`."""
    name = os.path.basename(path)
    ino = os.stat(path).st_ino
    sh("ip", "netns", "del", name)
    fillers: list[str] = []
    try:
        for _ in range(tries):
            filler = unique("crt-fill")
            sh("ip", "netns", "add", filler)
            fillers.append(filler)
            if os.stat(f"/var/run/netns/{filler}").st_ino == ino:
                open(path, "w").close()
                sh("mount", "--bind", f"/var/run/netns/{filler}", path)
                return
            if len(fillers) > 64:  # keep the holes filled, but do not hold thousands
                sh("ip", "netns", "del", fillers.pop(0))
                time.sleep(0.005)
        pytest.fail(f"the kernel did not hand out inode {ino} again in {tries} tries")
    finally:
        for f in fillers:
            sh("ip", "netns", "del", f, check=False)


def test_a_netns_remade_at_the_same_path_with_a_recycled_inode_is_another_life(sb):
    cid = unique("alloc-")
    netns = sb.container()
    old_ips = ips_of(sb.driver("add", cid, netns, ("8080:80/tcp", "8080:80/udp")))
    _remake_with_the_same_inode(sb, netns)
    [item] = [i for i in json.loads(cli(sb, "list", "--json").stdout) if i["containerID"] == cid]
    assert item["state"] == "dead" and "holds another namespace" in item["why"], item
    if not sb.stack.status:
        return  # without STATUS nothing of cni-reaper runs before bridge refuses the re-ADD (README)
    # Nomad 1.9.5+'s recreate after a failed CHECK: STATUS first, then ADD at the same path, no DEL
    new_ips = ips_of(sb.driver("add", cid, netns, ("8080:80/tcp", "8080:80/udp")))
    gone = [ip for ip in old_ips if ip not in new_ips]
    assert [l for l in sb.residue(NET, cid, gone) if any(f"{ip}/" in l or f"{ip}:" in l for ip in gone)] == []
    assert sb.reach(netns, "172.26.64.1", 8080, "recreated") == "recreated"


# -- two networks with their own settings in one state directory ------------------------------------
@pytest.mark.parametrize("sweeper", [NET, "services"])
def test_each_dead_record_is_cleaned_with_its_own_networks_settings(sb, sweeper):
    custom = json.loads(sb.shipped("custom-network.conflist").read_text())
    custom["plugins"][-1]["stateDir"] = "/var/lib/cni/reaper"  # shared with nomad-reaper (the default)
    custom["plugins"][-1]["logFile"] = str(sb.log_file)
    services = sb.root / "services.conflist"
    services.write_text(json.dumps(custom))
    nomad = sb.conflist()
    dead_n, dead_s, live = unique("alloc-"), unique("alloc-"), unique("alloc-")
    ns = {c: sb.container() for c in (dead_n, dead_s, live)}
    ips = {dead_n: ips_of(sb.driver("add", dead_n, ns[dead_n], ("8081:80/tcp",), nomad)),
           dead_s: ips_of(sb.driver("add", dead_s, ns[dead_s], ("8082:80/tcp",), services))}
    sb.remove_container(ns[dead_n])
    sb.remove_container(ns[dead_s])
    assert sb.reservations("services") and (sb.cni_dir / "services" / "services" / ips[dead_s][0]).exists()
    # one network's verb sweeps both: each record with the ipamDataDir and backend recorded with it
    ips[live] = ips_of(sb.driver("add", live, ns[live], ("8083:80/tcp",), nomad if sweeper == NET else services))
    assert sb.residue(NET, dead_n, ips[dead_n]) == []
    assert sb.residue("services", dead_s, ips[dead_s]) == []
    assert not (sb.cni_dir / "services" / "services" / ips[dead_s][0]).exists()
    assert sorted(r["containerID"] for r in sb.records()) == [live]


# -- a symlinked ipamDataDir is followed as host-local follows it -------------------------------------
def test_a_symlinked_ipam_data_dir_is_followed(sb):
    real = sb.cni_dir / "ipam-real"
    real.mkdir()
    (sb.cni_dir / "ipam-link").symlink_to("/var/lib/cni/ipam-real")
    data = json.loads(sb.conflist().read_text())
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["ipam"]["dataDir"] = "/var/lib/cni/ipam-link"
        if p["type"] == "cni-reaper":
            p["ipamDataDir"] = "/var/lib/cni/ipam-link"
    conflist = sb.root / "linked.conflist"
    conflist.write_text(json.dumps(data))
    dead, live = unique("alloc-"), unique("alloc-")
    ns_dead, ns_live = sb.container(), sb.container()
    ip_dead = ips_of(sb.driver("add", dead, ns_dead, ("8081:80/tcp",), conflist))[0]
    assert (real / NET / ip_dead).exists() and sb.record(dead)["current"]["ips"][0]["reservation"] is not None
    sb.remove_container(ns_dead)
    ips_of(sb.driver("add", live, ns_live, ("8082:80/tcp",), conflist))  # its sweep releases the dead one's
    assert not (real / NET / ip_dead).exists()
    assert sb.residue(NET, dead, [ip_dead]) == [] and [r["containerID"] for r in sb.records()] == [live]
    confdir = sb.root / "conf"
    confdir.mkdir()
    (confdir / "linked.conflist").write_text(json.dumps(data))
    doctor = json.loads(sb.run([str(sb.plugin_dir / "cni-reaper"), "doctor", "--json", "--cni-conf-dir",
                                str(confdir), "--cni-path", f"{sb.plugin_dir}:{sb.plugins}"]).stdout)
    ipam = [f for f in doctor["findings"] if f["check"] == "ipam-data-dir"]
    assert ipam and all(f["status"] == "OK" for f in ipam), ipam
