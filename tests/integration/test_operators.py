"""The operator's day: the CLI reads the installed conflists (list, sweep, metrics), `doctor` finds the silent
mistakes before something leaks, and the metrics a fleet alerts on agree with the log. Through a real runtime
(go-cni) and the real plugins, in throwaway namespaces; the shipped conflists are installed verbatim (the
sandbox mounts its own /var/lib/cni and /var/log where they point)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.sandbox import REPO, binary_exe, flavour_bin_dir, ips_of, reference_plugins, sh, unique

pytestmark = pytest.mark.netns


@pytest.fixture
def stack(two_stacks):
    return two_stacks


def cli(sb, *args):
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args])


def install(sb, *conflists: Path | tuple[str, dict]) -> Path:
    """A throwaway cni_config_dir with these conflists: a path is copied verbatim, (name, doc) written."""
    d = sb.root / "cni-config"
    d.mkdir(exist_ok=True)
    for c in conflists:
        if isinstance(c, tuple):
            (d / c[0]).write_text(json.dumps(c[1], indent=1))
        else:
            shutil.copy(c, d / c.name)
    return d


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a Prometheus text exposition, parsed by prometheus_client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def kind_of(item: str) -> tuple[str, int]:
    """What one item of a "removed" log line is, read from its text as an operator would."""
    if item.startswith("host-local reservation"):
        return "reservation", 1
    if item.startswith("conntrack:"):
        return "conntrack", int(item.split()[1])
    if item.startswith("nft "):
        return ("nftables_masquerade" if "native masquerade" in item else "nftables_dnat"), 1
    if " filter CNI-FORWARD:" in item:
        return "firewall", 1
    return ("masquerade" if "masquerade" in item else "dnat"), 1


# -- the CLI reads the conflists ---------------------------------------------------------------------
def test_list_and_sweep_find_the_custom_network_from_its_installed_conflist(sandbox):
    """The shipped custom-network conflist keeps its records and reservations in directories of its own;
    with only --cni-conf-dir, list and sweep find them (with the defaults alone they see nothing)."""
    confdir = install(sandbox, sandbox.shipped("custom-network.conflist"))
    conflist = confdir / "custom-network.conflist"
    live, dead = unique("alloc-"), unique("alloc-")
    live_ns, dead_ns = sandbox.container(), sandbox.container()
    ips = {live: ips_of(sandbox.driver("add", live, live_ns, ("8080:80/tcp",), conflist)),
           dead: ips_of(sandbox.driver("add", dead, dead_ns, ("8081:80/tcp",), conflist))}
    assert (sandbox.cni_dir / "reaper-services").is_dir() and (sandbox.cni_dir / "services" / "services").is_dir()
    sandbox.remove_container(dead_ns)
    live_rules = sandbox.residue("services", live, ips[live])

    blind = cli(sandbox, "list", "--json", "--cni-conf-dir", str(sandbox.root / "nothing-here"))
    assert blind.returncode == 0 and json.loads(blind.stdout) == []  # what the issue reported

    listing = cli(sandbox, "list", "--json", "--cni-conf-dir", str(confdir))
    assert listing.returncode == 0, listing.stderr
    seen = {r["containerID"]: (r["network"], r["state"], r["stateDir"]) for r in json.loads(listing.stdout)}
    assert seen == {live: ("services", "live", "/var/lib/cni/reaper-services"),
                    dead: ("services", "dead", "/var/lib/cni/reaper-services")}

    before = sandbox.tables()
    dry = cli(sandbox, "sweep", "--cni-conf-dir", str(confdir))
    assert dry.returncode == 3, dry.stdout + dry.stderr
    assert dead in dry.stdout and live not in dry.stdout
    assert f"host-local reservation services/{ips[dead][0]}" in dry.stdout  # from /var/lib/cni/services
    assert sandbox.tables() == before and dead in sandbox.reservations("services").values()

    applied = cli(sandbox, "sweep", "--apply", "--cni-conf-dir", str(confdir))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert sandbox.residue("services", dead, ips[dead]) == []
    assert sandbox.residue("services", live, ips[live]) == live_rules
    # logged where the conflist says (its logFile, /var/log/cni-reaper.log: the sandbox's)
    lines = [json.loads(l) for l in (sandbox.var_log / "cni-reaper.log").read_text().splitlines()]
    assert any(l["msg"] == "removed" and l["containerID"] == dead and l["verb"] == "sweep" for l in lines)
    again = cli(sandbox, "sweep", "--cni-conf-dir", str(confdir))
    assert again.returncode == 0 and again.stdout.startswith("0 item(s)"), again.stdout


def test_networks_sharing_a_state_directory_each_with_its_own_keys(sandbox):
    """Two conflists, one state directory: every attachment is listed once, each network is cleaned with
    its own ipamDataDir, and --network picks one."""
    custom = json.loads(sandbox.shipped("custom-network.conflist").read_text())
    custom["plugins"][-1]["stateDir"] = "/var/lib/cni/reaper"  # the one nomad-reaper uses (the default)
    confdir = install(sandbox, sandbox.shipped("nomad-reaper.conflist"), ("20-services.conflist", custom))
    nomad, services = confdir / "nomad-reaper.conflist", confdir / "20-services.conflist"
    live, dead_n, dead_s = unique("alloc-"), unique("alloc-"), unique("alloc-")
    ns = {cid: sandbox.container() for cid in (live, dead_n, dead_s)}
    ips = {live: ips_of(sandbox.driver("add", live, ns[live], ("8080:80/tcp",), nomad)),
           dead_n: ips_of(sandbox.driver("add", dead_n, ns[dead_n], ("8081:80/tcp",), nomad)),
           dead_s: ips_of(sandbox.driver("add", dead_s, ns[dead_s], ("8082:80/tcp",), services))}
    sandbox.remove_container(ns[dead_n])
    sandbox.remove_container(ns[dead_s])

    listing = json.loads(cli(sandbox, "list", "--json", "--cni-conf-dir", str(confdir)).stdout)
    assert sorted((r["containerID"], r["network"], r["state"]) for r in listing) == sorted(
        [(live, "nomad-reaper", "live"), (dead_n, "nomad-reaper", "dead"), (dead_s, "services", "dead")])
    only = json.loads(cli(sandbox, "list", "--json", "--network", "services", "--cni-conf-dir", str(confdir)).stdout)
    assert [r["containerID"] for r in only] == [dead_s]

    one = cli(sandbox, "sweep", "--apply", "--network", "services", "--cni-conf-dir", str(confdir))
    assert one.returncode == 0, one.stdout + one.stderr
    assert sandbox.residue("services", dead_s, ips[dead_s]) == []  # its reservation was in services/
    assert sandbox.residue("nomad-reaper", dead_n, ips[dead_n])  # not this network's turn
    both = cli(sandbox, "sweep", "--apply", "--cni-conf-dir", str(confdir))
    assert both.returncode == 0, both.stdout + both.stderr
    assert sandbox.residue("nomad-reaper", dead_n, ips[dead_n]) == []
    assert sandbox.residue("nomad-reaper", live, ips[live])
    assert [r["containerID"] for r in sandbox.records()] == [live]


def test_the_sysbatch_example_sweeps_and_writes_the_metrics_as_shipped(sandbox):
    """The shell line of conflist/nomad/cni-reaper-sweep.nomad.hcl, run as raw_exec would run it on a client
    whose /opt/cni holds the plugin and the shipped custom-network conflist (a tmpfs over /opt in the
    sandbox's private mount namespace): the dead attachment is cleaned and the textfile written."""
    import hcl2

    with open(REPO / "conflist" / "nomad" / "cni-reaper-sweep.nomad.hcl") as f:
        [(_, job)] = hcl2.load(f)["job"][0].items()
    [(_, group)] = job["group"][0].items()
    [(_, task)] = group["task"][0].items()
    script = json.loads(task["config"][0]["args"][1])
    conflist = install(sandbox, sandbox.shipped("custom-network.conflist")) / "custom-network.conflist"
    dead, ns = unique("alloc-"), sandbox.container()
    ips = ips_of(sandbox.driver("add", dead, ns, ("8080:80/tcp",), conflist))
    sandbox.remove_container(ns)
    textfile = sandbox.root / "textfile"
    textfile.mkdir()
    opt = (f"mount -t tmpfs none /opt && mkdir -p /opt/cni/bin /opt/cni/config && "
           f"ln -s {sandbox.plugin_dir / 'cni-reaper'} /opt/cni/bin/cni-reaper && cp {conflist} /opt/cni/config/")
    proc = sandbox.run(["/bin/sh", "-c", script], env={"TEXTFILE_DIR": str(textfile)}, pre=opt)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sandbox.residue("services", dead, ips) == []
    got = samples((textfile / "cni_reaper.prom").read_text())
    assert got[("cni_reaper_attachments_cleaned_total", (("network", "services"),))] == 1
    assert got[("cni_reaper_sweep_duration_seconds_count", (("verb", "sweep"),))] == 1


# -- metrics -----------------------------------------------------------------------------------------
def test_metrics_count_what_the_log_says_was_removed(sandbox):
    confdir = install(sandbox, sandbox.shipped("custom-network.conflist"))
    conflist = confdir / "custom-network.conflist"
    state = sandbox.cni_dir / "reaper-services"
    live, a, b = unique("alloc-"), unique("alloc-"), unique("alloc-")
    ns = {cid: sandbox.container() for cid in (live, a, b)}
    ports = {live: ("8080:80/tcp",), a: ("8081:80/tcp", "8081:80/udp"), b: ("8082:80/tcp",)}
    for cid in (live, a, b):
        ips_of(sandbox.driver("add", cid, ns[cid], ports[cid], conflist))
    assert not (state / ".metrics").exists(), "an ADD with nothing stale wrote the counters"
    sandbox.remove_container(ns[a])
    sandbox.remove_container(ns[b])

    text = cli(sandbox, "metrics", "--cni-conf-dir", str(confdir))
    assert text.returncode == 0, text.stderr
    got = samples(text.stdout)
    assert got[("cni_reaper_records", (("network", "services"), ("state", "dead")))] == 2
    assert got[("cni_reaper_records", (("network", "services"), ("state", "live")))] == 1
    assert got[("cni_reaper_attachments_cleaned_total", (("network", "services"),))] == 0

    # the next allocation's ADD (or the STATUS before it) sweeps both dead attachments
    third = unique("alloc-")
    ips_of(sandbox.driver("add", third, sandbox.container(), ("8083:80/tcp",), conflist))
    lines = [json.loads(l) for l in (sandbox.var_log / "cni-reaper.log").read_text().splitlines()]
    removed = [l for l in lines if l["msg"] == "removed"]
    assert {l["containerID"] for l in removed} == {a, b}
    [verb] = {l["verb"] for l in removed}  # Nomad 1.9.5+ asks STATUS first: that call sweeps
    assert verb == ("STATUS" if sandbox.stack.status else "ADD")
    expected: dict[str, int] = {}
    for line in removed:
        for item in line["items"]:
            kind, n = kind_of(item)
            expected[kind] = expected.get(kind, 0) + n
    assert {"masquerade", "dnat", "firewall", "reservation"} <= set(expected)

    text = cli(sandbox, "metrics", "--cni-conf-dir", str(confdir))
    got = samples(text.stdout)
    counted = {dict(labels)["kind"]: v for (name, labels), v in got.items()
               if name == "cni_reaper_removed_total" and v}
    assert counted == expected
    assert got[("cni_reaper_attachments_cleaned_total", (("network", "services"),))] == 2
    assert got[("cni_reaper_cleanup_failures_total", (("network", "services"),))] == 0
    assert got[("cni_reaper_sweep_duration_seconds_count", (("verb", verb),))] == 1
    assert got[("cni_reaper_records", (("network", "services"), ("state", "dead")))] == 0
    assert got[("cni_reaper_records", (("network", "services"), ("state", "live")))] == 2
    assert got[("cni_reaper_last_sweep_timestamp_seconds", ())] > 0

    # ADD with nothing stale leaves the counters alone
    mtime = (state / ".metrics").stat().st_mtime_ns
    ips_of(sandbox.driver("add", unique("alloc-"), sandbox.container(), (), conflist))
    assert (state / ".metrics").stat().st_mtime_ns == mtime

    # node_exporter's textfile collector gets the same text
    textfile = sandbox.root / "textfile"
    textfile.mkdir()
    wrote = cli(sandbox, "metrics", "--cni-conf-dir", str(confdir), "--textfile", str(textfile))
    assert wrote.returncode == 0, wrote.stderr
    assert samples((textfile / "cni_reaper.prom").read_text()) == samples(
        cli(sandbox, "metrics", "--cni-conf-dir", str(confdir)).stdout)


@pytest.mark.parametrize("exe_kind", ["package", "binary"])
@pytest.mark.parametrize("syscall", ["fsync", "rename,renameat,renameat2"])
def test_the_textfile_is_never_seen_in_part(tmp_path, exe_kind, syscall, package_exe):
    """metrics --textfile killed (SIGKILL, by strace at the syscall) after writing and before the file is in
    place: the collector's directory holds the previous complete file, or none; a later run replaces it."""
    exe = package_exe if exe_kind == "package" else binary_exe()
    state, confs, out = tmp_path / "state", tmp_path / "conf", tmp_path / "textfile"
    out.mkdir()
    args = [exe, "metrics", "--cni-conf-dir", str(confs), "--state-dir", str(state), "--textfile", str(out)]

    def killed() -> None:
        proc = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"inject={syscall}:signal=KILL", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, proc.stderr  # it was killed

    killed()
    assert list(out.glob("*.prom")) == []  # the first run died: no file at all, not part of one
    assert subprocess.run(args, capture_output=True).returncode == 0
    complete = (out / "cni_reaper.prom").read_text()
    assert samples(complete)
    killed()
    assert (out / "cni_reaper.prom").read_text() == complete and len(list(out.glob("*.prom"))) == 1


# -- doctor ------------------------------------------------------------------------------------------
@pytest.fixture
def doc(tmp_path):
    """A throwaway netns to run doctor in, a plugin directory (Debian 12's plugins and cni-reaper) and a
    conflist whose every path is under tmp_path."""
    netns = unique("crt-doc")
    sh("ip", "netns", "add", netns)
    bindir = tmp_path / "cni-bin"
    bindir.mkdir()
    for p in reference_plugins("1.1.1").iterdir():
        (bindir / p.name).symlink_to(p)
    (bindir / "cni-reaper").symlink_to(binary_exe())
    conf = json.loads((REPO / "conflist" / "custom-network.conflist").read_text())
    conf["plugins"][1]["ipam"]["dataDir"] = str(tmp_path / "ipam")
    conf["plugins"][-1].update(stateDir=str(tmp_path / "state"), ipamDataDir=str(tmp_path / "ipam"),
                               logFile=str(tmp_path / "reaper.log"))

    class Doc:
        root, cni_path, ns, good = tmp_path, bindir, netns, conf

        def run(self, conflists: dict[str, dict | str], *args: str, env: dict | None = None):
            d = tmp_path / "conf"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            for name, c in conflists.items():
                (d / name).write_text(c if isinstance(c, str) else json.dumps(c))
            proc = subprocess.run(["ip", "netns", "exec", netns, binary_exe(), "doctor", "--json", "--cni-conf-dir",
                                   str(d), "--cni-path", str(bindir), *args], capture_output=True, text=True,
                                  env=env, timeout=60)
            findings = json.loads(proc.stdout)["findings"]
            return proc.returncode, findings

    try:
        yield Doc()
    finally:
        sh("ip", "netns", "del", netns, check=False)


def _with(conf: dict, change) -> dict:
    c = json.loads(json.dumps(conf))
    change(c)
    return c


def _last(c: dict) -> dict:
    return c["plugins"][-1]


BROKEN = {
    "not-last": (lambda c: c["plugins"].insert(0, c["plugins"].pop()), "FAIL", "last-plugin"),
    "no-capability": (lambda c: _last(c).pop("capabilities"), "FAIL", "capability"),
    "ipam-dir-differs": (lambda c: _last(c).update(ipamDataDir="/var/lib/cni/networks"), "FAIL", "ipam-data-dir"),
    "plugin-missing": (lambda c: c["plugins"].insert(1, {"type": "no-such-plugin"}), "FAIL", "plugins"),
    "version-unknown": (lambda c: c.update(cniVersion="2.0.0"), "FAIL", "cni-version"),
    "version-the-plugins-do-not-speak": (lambda c: c.update(cniVersion="1.1.0"), "FAIL", "cni-version"),
    "log-dir-missing": (lambda c: _last(c).update(logFile="/nonexistent-dir/reaper.log"), "WARN", "log-file"),
}


def test_doctor_passes_a_correct_conflist(doc):
    rc, findings = doc.run({"services.conflist": doc.good})
    assert rc == 0, findings
    assert not [f for f in findings if f["status"] != "OK"], findings
    checks = {f["check"] for f in findings}
    assert {"conflist", "last-plugin", "capability", "ipam-data-dir", "plugins", "cni-version", "state-dir", "log-file",
            "dead-records", "iptables", "nftables"} <= checks


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_doctor_names_each_mistake_with_its_fix(doc, case):
    change, status, check = BROKEN[case]
    rc, findings = doc.run({"services.conflist": _with(doc.good, change)})
    hits = [f for f in findings if f["check"] == check and f["status"] == status]
    assert hits and all(h["fix"] and h["network"] == "services" for h in hits), findings
    assert [f for f in findings if f["status"] != "OK"] == hits, findings  # nothing else is flagged
    assert (rc == 5) == (status == "FAIL"), (rc, findings)


def test_doctor_on_the_state_directory_and_records(doc):
    state = doc.root / "state"
    rc, findings = doc.run({"s.conflist": doc.good})
    assert [f["status"] for f in findings if f["check"] == "state-dir"] == ["OK"]  # will be created
    assert not state.exists(), "doctor created the state directory"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    rc, findings = doc.run({"s.conflist": doc.good})
    assert [f["status"] for f in findings if f["check"] == "state-dir"] == ["WARN"] and rc == 0
    assert (state.stat().st_mode & 0o777) == 0o755, "doctor changed the mode"
    os.chown(state, 1000, 1000)
    rc, findings = doc.run({"s.conflist": doc.good})
    assert [f["status"] for f in findings if f["check"] == "state-dir"] == ["FAIL"] and rc == 5
    os.chown(state, 0, 0)
    os.chmod(state, 0o700)
    # two records, one of a netns that is then removed: one dead, one live
    gone = unique("crt-gone")
    sh("ip", "netns", "add", gone)
    for cid, netns in (("alive-1", doc.ns), ("gone-1", gone)):
        conf = {"cniVersion": "1.0.0", "name": "services", "type": "cni-reaper", "stateDir": str(state),
                "logFile": "", "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.123.0.9/24"}]}}
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": f"/var/run/netns/{netns}",
               "CNI_IFNAME": "eth0", "CNI_PATH": str(doc.cni_path), "PATH": os.environ["PATH"]}
        add = subprocess.run(["ip", "netns", "exec", doc.ns, binary_exe()], input=json.dumps(conf), text=True,
                             capture_output=True, env=env)
        assert add.returncode == 0, add.stderr
    sh("ip", "netns", "del", gone)
    rc, findings = doc.run({"s.conflist": doc.good})
    [dead] = [f for f in findings if f["check"] == "dead-records"]
    assert dead["status"] == "WARN" and dead["message"].startswith("1 dead attachment(s)"), dead
    assert "(1 live)" in dead["message"] and rc == 0


def test_doctor_on_the_conf_dir_itself(doc):
    rc, findings = doc.run({})
    assert rc == 5 and [(f["status"], f["check"]) for f in findings if f["status"] != "OK"] == [("FAIL", "conflist")]
    other = _with(doc.good, lambda c: None)
    rc, findings = doc.run({"10-services.conflist": doc.good, "20-services.conflist": other, "30-bad.conflist": "{nope"})
    flagged = sorted((f["status"], f["check"]) for f in findings if f["status"] != "OK")
    assert flagged == [("WARN", "conflist"), ("WARN", "duplicate")], findings
    assert rc == 0


def test_doctor_sees_cni_rules_stranded_in_the_other_iptables_flavour(doc):
    """iptables now points at nft, but the legacy nat table still holds a CNI chain: the plugins and
    cni-reaper no longer see it; doctor says so (and changes nothing)."""
    sh("ip", "netns", "exec", doc.ns, "iptables-legacy", "-t", "nat", "-N", "CNI-0123456789abcdef01234567")
    before = sh("ip", "netns", "exec", doc.ns, "iptables-legacy-save", "-t", "nat").stdout
    path = f"{flavour_bin_dir(doc.root, 'nft')}:{os.environ['PATH']}"
    rc, findings = doc.run({"s.conflist": doc.good}, env=dict(os.environ, PATH=path))
    stranded = [f for f in findings if f["check"] == "iptables" and f["status"] == "WARN"]
    assert len(stranded) == 1 and "legacy tables hold 1 CNI chain" in stranded[0]["message"], findings
    assert rc == 0
    after = sh("ip", "netns", "exec", doc.ns, "iptables-legacy-save", "-t", "nat").stdout
    strip = lambda t: [l for l in t.splitlines() if not l.startswith("#")]
    assert strip(after) == strip(before)
