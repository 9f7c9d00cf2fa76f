"""Nomad's own `bridge` network with no job change: cni-reaper wraps `portmap` (a link named portmap in a
directory first on the plugin path, as Nomad passes cni_path), through go-cni with Nomad 2.0's bridge
conflist exactly, the reference plugins 1.1.1 and 1.9, both iptables flavours."""

from __future__ import annotations

import fcntl
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.nomad import Client
from testkit.sandbox import Stack, ips_of, open_sandbox, sh, unique

pytestmark = pytest.mark.netns
NET = "nomad"
PORTS = ("8080:80/tcp", "8080:80/udp")


@pytest.fixture
def client(tmp_path, flavour, reaper_exe, two_stacks):
    with open_sandbox(tmp_path, flavour, reaper_exe, two_stacks) as sb:
        yield Client(sb)


def test_the_wrapper_records_the_attachment_and_nomad_sees_portmaps_version(client):
    sb = client.sb
    cid, netns = unique("alloc-"), sb.container()
    [ip] = ips_of(client.driver("add", cid, netns, PORTS))
    record = sb.record(cid)
    assert record["network"] == NET and record["current"]["ips"][0]["address"] == ip
    # host-local's data directory of Nomad 1.9.4+ (/var/run/cni) was found where the reservation is
    assert record["current"]["ips"][0]["reservation"]["dataDir"] == "/var/run/cni"
    assert {(p["hostPort"], p["protocol"]) for p in record["current"]["portMappings"]} == {(8080, "tcp"), (8080, "udp")}
    # Nomad's fingerprint: every file on cni_path run with no arguments and no CNI_COMMAND; the wrapper answers
    # as portmap does (what Nomad takes for plugins.cni.version.portmap)
    bare = sb.run([str(client.wrap / "portmap")], env={"CNI_PATH": sb.plugin_path})
    real = sb.run([str(sb.plugins / "portmap")])
    assert (bare.returncode, bare.stdout, bare.stderr) == (real.returncode, real.stdout, real.stderr)


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "dualstack"])
def test_netns_gone_then_del_leaves_nothing(tmp_path, flavour, package_exe, two_stacks, ipv6):
    with open_sandbox(tmp_path, flavour, package_exe, two_stacks) as sb:
        client = Client(sb, ipv6=ipv6)
        cid, netns = unique("alloc-"), sb.container()
        ips = ips_of(client.driver("add", cid, netns, PORTS))
        assert len(ips) == (2 if ipv6 else 1) and sb.residue(NET, cid, ips)
        sb.remove_container(netns)
        assert client.driver("del", cid, netns, PORTS).returncode == 0
        assert sb.residue(NET, cid, ips) == []


def test_the_6385_sequence_leaves_nothing_and_the_final_del_succeeds(client):
    sb = client.sb
    cid, first = unique("alloc-"), sb.container()
    old = ips_of(client.driver("add", cid, first, PORTS))
    sb.remove_container(first)
    second = sb.container()
    readd = client.driver("add", cid, second, PORTS)
    assert readd.returncode != 0 and "duplicate allocation" in readd.stderr  # bridge refuses before portmap runs
    assert client.driver("del", cid, second, PORTS).returncode == 0
    new = ips_of(client.driver("add", cid, second, PORTS))
    final = client.driver("del", cid, second, PORTS)
    assert final.returncode == 0, final.stderr
    sb.remove_container(second)
    sb.status(name=NET, cniVersion="1.1.0")
    assert sb.residue(NET, cid, old + new) == []


def test_nomads_restart_path_at_the_same_path_is_cleaned_by_the_next_sweep(client):
    """Nomad 1.9.5+ after a failed CHECK: the netns destroyed and made again at the same path, ADD with no DEL.
    At 0.4.0 nothing of cni-reaper runs before bridge, which refuses the re-ADD as without it (README, "Installing
    into Nomad"); the next call on the client (another allocation's ADD) removes the old life's rules and releases
    its reservation, and a teardown and setup of the allocation then succeeds and is reached over TCP."""
    from testkit.nomad import reservations_dir

    sb = client.sb
    cid, netns = unique("alloc-"), sb.container()
    old = ips_of(client.driver("add", cid, netns, PORTS))
    name = netns.rsplit("/", 1)[1]
    sh("ip", "netns", "del", name)
    sh("ip", "netns", "add", name)
    readd = client.driver("add", cid, netns, PORTS)
    assert readd.returncode != 0 and "duplicate allocation" in readd.stderr
    other = sb.container()
    ips_of(client.driver("add", unique("alloc-"), other, ("8090:80/tcp",)))
    assert [l for l in sb.residue(NET, cid, old) if cid in l] == []
    assert not [p.name for p in reservations_dir(sb).glob("172.*") if cid in p.read_text()]
    assert client.driver("del", cid, netns, PORTS).returncode == 0
    ips_of(client.driver("add", cid, netns, PORTS))
    assert sb.reach(netns, "172.26.64.1", 8080, "after restart") == "after restart"


def test_an_allocation_that_died_without_del_gives_its_port_to_the_next(client):
    sb = client.sb
    dead, a = unique("alloc-"), sb.container()
    ips_of(client.driver("add", dead, a, PORTS))
    sb.remove_container(a)
    live, b = unique("alloc-"), sb.container()
    ips_of(client.driver("add", live, b, PORTS))
    assert not [l for l in sb.residue(NET, dead, []) if "dnat" in l or "CNI-DN-" in l]
    assert sb.reach(b, "172.26.64.1", 8080, "next") == "next"


def test_a_dels_sweep_beside_the_real_portmap_cleans_an_allocation_that_died_meanwhile(client):
    """The wrapped DEL of a live allocation leaves nothing of its own to remove before portmap's DEL, so its
    sweep of the others runs while the real portmap runs: an allocation that died since the last call is
    cleaned by it all the same, and the DEL's own allocation is torn down by the plugins as ever."""
    from testkit.nomad import reservations_dir

    sb = client.sb
    dead, a = unique("alloc-"), sb.container()
    old = ips_of(client.driver("add", dead, a, PORTS))
    live, b = unique("alloc-"), sb.container()
    mine = ips_of(client.driver("add", live, b, ("8090:80/tcp",)))
    sb.remove_container(a)  # dies with no DEL, after the last ADD's sweep
    assert sb.residue(NET, dead, old)
    assert [p.name for p in reservations_dir(sb).glob("172.*") if dead in p.read_text()]
    delete = client.driver("del", live, b, ("8090:80/tcp",))
    assert delete.returncode == 0, delete.stderr
    assert sb.residue(NET, dead, old) == []
    assert not [p.name for p in reservations_dir(sb).glob("172.*") if dead in p.read_text()]
    assert sb.residue(NET, live, mine) == []


def test_a_reboot_with_restored_rules_is_cleaned_by_the_first_add(client):
    sb = client.sb
    before = {}
    for port in ("8080", "8081"):
        cid = unique("alloc-")
        before[cid] = ips_of(client.driver("add", cid, sb.container(), (f"{port}:80/tcp", f"{port}:80/udp")))
    sb.reboot(tmpfs_dirs=("/var/run/cni",))  # Nomad's dataDir is a tmpfs
    cid, netns = unique("alloc-"), sb.container()
    ips_of(client.driver("add", cid, netns, PORTS))
    for old, ips in before.items():
        assert [l for l in sb.residue(NET, old, ips) if old in l] == [], old
    assert sb.reach(netns, "172.26.64.1", 8080, "after reboot") == "after reboot"


@pytest.mark.parametrize("shape", ["null", "empty"])
def test_a_portless_allocation_is_recorded_and_cleaned(client, shape):
    sb = client.sb
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(client.driver("add", cid, netns, ports_shape=shape))
    assert sb.record(cid)["current"]["portMappings"] == []
    sb.remove_container(netns)
    ips_of(client.driver("add", unique("alloc-"), sb.container()))  # the next ADD's sweep
    assert sb.residue(NET, cid, ips) == []


def test_gc_through_a_cni_1_1_0_form_of_the_bridge_network(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe, Stack("1.9", "go-cni-1.1.13")) as sb:
        client = Client(sb, version="1.1.0")
        keep, drop = unique("alloc-"), unique("alloc-")
        ips = {c: ips_of(client.driver("add", c, sb.container(), (f"{p}:80/tcp",))) for c, p in ((keep, 8090), (drop, 8091))}
        kept = sb.residue(NET, keep, ips[keep])
        gc = client.driver("gc", valid=(f"{keep}:eth0",))
        assert gc.returncode == 0, gc.stderr
        assert sb.residue(NET, drop, ips[drop]) == [] and sb.residue(NET, keep, ips[keep]) == kept


def test_transparent_proxy_with_consul_cni_after_the_wrapped_portmap(tmp_path, flavour, package_exe, two_stacks):
    with open_sandbox(tmp_path, flavour, package_exe, two_stacks) as sb:
        client = Client(sb, consul_cni=True)
        cid, netns = unique("alloc-"), sb.container()
        ips = ips_of(client.driver("add", cid, netns, PORTS))
        assert sb.record(cid) is not None and sb.reach(netns, "172.26.64.1", 8080, "mesh") == "mesh"
        sb.remove_container(netns)
        ips_of(client.driver("add", unique("alloc-"), sb.container(), ("8081:80/tcp",)))
        assert sb.residue(NET, cid, ips) == []


def test_docker_style_netns_paths_are_recorded_and_judged_like_nomads(client):
    """A Docker task's network is a pause container's: /var/run/docker/netns/<12 hex>."""
    from testkit.sandbox import mountpoint

    sb = client.sb
    mountpoint("/run/docker")
    mountpoint("/run/docker/netns")
    paths, names = [], []
    for _ in range(2):
        ns = sb.container()
        path = f"/var/run/docker/netns/{os.urandom(6).hex()}"
        open(path, "w").close()
        sh("mount", "--bind", ns, path)
        paths.append(path)
        names.append(ns)
    try:
        live, dead = unique("alloc-"), unique("alloc-")
        ips_live = ips_of(client.driver("add", live, paths[0], ("8082:80/tcp",)))
        ips_dead = ips_of(client.driver("add", dead, paths[1], ("8083:80/tcp",)))
        assert sb.record(dead)["current"]["netns"] == paths[1]
        kept = sb.residue(NET, live, ips_live)
        sh("umount", paths[1])
        os.unlink(paths[1])  # the pause container is gone, and its namespace with it
        sb.remove_container(names[1])
        assert client.driver("add", unique("alloc-"), sb.container()).returncode == 0
        assert sb.residue(NET, dead, ips_dead) == [] and sb.residue(NET, live, ips_live) == kept
    finally:
        for p in paths:
            sh("umount", p, check=False)
            if os.path.exists(p):
                os.unlink(p)


# -- indistinguishable from portmap ---------------------------------------------------------------------------
def _prev(version: str) -> dict:
    return {"cniVersion": version, "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
            "ips": [{"address": "172.26.64.9/20", "gateway": "172.26.64.1", "interface": 0}]}


requests = st.fixed_dictionaries({
    "command": st.sampled_from(["ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC", ""]),
    "version": st.sampled_from(["0.3.1", "0.4.0", "1.0.0", "1.1.0", "9.9.9", ""]),
    "prev": st.sampled_from(["good", "missing", "garbage"]),
    "ports": st.sampled_from([[], [{"hostPort": 9100, "containerPort": 80, "protocol": "tcp"}],
                              [{"hostPort": 0, "containerPort": 80, "protocol": "tcp"}], None]),
    "stdin": st.sampled_from(["json", "not-json", "empty", "array"]),
    "cid": st.sampled_from(["alloc-x", "", "bad/id"]),
})


def _request(r: dict) -> tuple[dict, str]:
    conf: dict = {"cniVersion": r["version"], "name": NET, "type": "portmap", "snat": True,
                  "capabilities": {"portMappings": True}, "runtimeConfig": {"portMappings": r["ports"]}}
    if r["prev"] == "good":
        conf["prevResult"] = _prev(r["version"] or "0.4.0")
    elif r["prev"] == "garbage":
        conf["prevResult"] = "nope"
    stdin = {"json": json.dumps(conf), "not-json": "{x", "empty": "", "array": "[]"}[r["stdin"]]
    env = {"CNI_COMMAND": r["command"], "CNI_CONTAINERID": r["cid"], "CNI_NETNS": "/var/run/netns/x",
           "CNI_IFNAME": "eth0"}
    return {k: v for k, v in env.items() if v}, stdin


def test_the_wrapper_answers_every_request_as_portmap_does(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb, settings={"stateDir": str(tmp_path / "state")})

        @settings(max_examples=int(os.environ.get("CNI_REAPER_WRAP_EXAMPLES", "120")), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(requests)
        def same(r):
            env, stdin = _request(r)
            direct = sb.run([str(sb.plugins / "portmap")], env={**env, "CNI_PATH": str(sb.plugins)}, input=stdin)
            wrapped = sb.run([str(client.wrap / "portmap")], env={**env, "CNI_PATH": sb.plugin_path}, input=stdin)
            assert (wrapped.returncode, wrapped.stdout) == (direct.returncode, direct.stdout), r

        same()


# -- never block ---------------------------------------------------------------------------------------
FAILING = {
    "state-dir-a-file": ({"stateDir": "/var/lib/cni/not-a-dir"}, None),
    "settings-not-json": (None, "{not json"),
    "lock-never-free": ({"lockTimeout": 300, "wrapTimeout": 0.5}, None),
}


@pytest.mark.parametrize("case", sorted(FAILING))
def test_the_real_answer_stands_when_cni_reapers_own_part_fails(tmp_path, flavour, package_exe, case):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        keys, raw = FAILING[case]
        client = Client(sb, settings=keys)
        if raw is not None:
            client.settings.write_text(raw)
        (sb.cni_dir / "not-a-dir").write_text("x")
        holder = None
        if case == "lock-never-free":
            state = sb.cni_dir / "reaper"
            state.mkdir(mode=0o700)
            holder = open(state / ".lock", "w")  # noqa: SIM115 - held across the calls below, closed in finally
            fcntl.flock(holder, fcntl.LOCK_EX)
        try:
            cid, netns = unique("alloc-"), sb.container()
            add = client.driver("add", cid, netns, PORTS)
            assert add.returncode == 0, add.stderr
            assert client.driver("check", cid, netns, PORTS).returncode == 0 or sb.stack.plugins == "1.1.1"
            delete = client.driver("del", cid, netns, PORTS)
            assert delete.returncode == 0, delete.stderr
            # its own part said why it did nothing, in its log (the settings' logFile, else the default one), and
            # nothing on the stderr that is the real plugin's
            logs = [sb.log_file, sb.var_log / "cni-reaper.log"]
            assert any("cni-reaper" in p.read_text() and ('"warning"' in p.read_text() or '"error"' in p.read_text()) for p in logs if p.exists())
            assert '"level"' not in add.stderr + delete.stderr, add.stderr
        finally:
            if holder is not None:
                holder.close()


def test_doctor_checks_the_wrap(client, tmp_path):
    sb = client.sb
    exe = str(sb.plugin_dir / "cni-reaper")

    def doctor(cni_path: str, nomad_dir: str = str(tmp_path / "no-nomad")) -> list[dict]:
        out = sb.run([exe, "doctor", "--json", "--cni-path", cni_path, "--nomad-config", nomad_dir,
                      "--cni-conf-dir", str(tmp_path / "none"), "--config", str(client.settings)])
        return [f for f in json.loads(out.stdout)["findings"] if f["check"] in ("wrap", "conflist")]

    good = doctor(sb.plugin_path)
    assert [f["status"] for f in good] == ["OK", "OK"], good
    shadowed = doctor(f"{sb.plugins}:{client.wrap}")
    assert any(f["status"] == "FAIL" and "comes before the wrapper" in f["message"] for f in shadowed), shadowed
    alone = doctor(str(client.wrap))
    assert any(f["status"] == "FAIL" and "finds no real portmap" in f["message"] for f in alone), alone
    nomad = tmp_path / "nomad.d"
    nomad.mkdir()
    (nomad / "client.hcl").write_text(f'client {{\n  cni_path = "{sb.plugins}:{client.wrap}"\n}}\n')
    late = doctor(sb.plugin_path, str(nomad))
    assert any(f["status"] == "WARN" and "is not first" in f["message"] for f in late), late
