"""The periodic sweep for hosts without raw_exec: conflist/systemd/cni-reaper-sweep.timer and .service, as
the .deb and `scripts/install.sh --timer` ship them. systemd's own checker passes them, and the service's
command, run as shipped on a host whose /opt/cni holds the plugin and a conflist, removes a dead attachment
and writes the textfile, inside the service's own file system and capability limits (emulated here: this
machine's PID 1 is not systemd, so the unit itself cannot be started)."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.sandbox import DEBIAN12, REPO, binary_exe, ips_of, open_sandbox, unique

pytestmark = [pytest.mark.netns, pytest.mark.release]
UNITS = REPO / "conflist" / "systemd"


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's settings: section -> key -> every value given (systemd keys repeat)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for line in (UNITS / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out[section] = {}
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key, []).append(value)
    return out


def test_the_units_pass_systemd_analyze_verify(tmp_path):
    """As the .deb ships them (read from the built package), systemd-analyze verify finds nothing to say:
    no unknown key, no value it cannot parse, an ExecStart it can execute."""
    debs = sorted((REPO / "dist").glob("cni-reaper_*_amd64.deb"))
    if not debs:
        pytest.fail("no .deb built: run scripts/release.sh")
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(tmp_path / "pkg")], check=True)
    units = tmp_path / "pkg" / "lib" / "systemd" / "system"
    assert sorted(p.name for p in units.iterdir()) == ["cni-reaper-sweep.service", "cni-reaper-sweep.timer"]
    for p in units.iterdir():
        assert p.read_bytes() == (UNITS / p.name).read_bytes()
    proc = subprocess.run(["systemd-analyze", "verify", str(units / "cni-reaper-sweep.timer"),
                           str(units / "cni-reaper-sweep.service")], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "", proc.stdout + proc.stderr


def test_the_timer_runs_the_service_every_few_minutes_and_is_enabled_only_by_hand():
    timer = unit("cni-reaper-sweep.timer")
    assert timer["Timer"]["OnUnitActiveSec"] == ["5min"] and timer["Timer"]["OnBootSec"]
    assert "Unit" not in timer["Timer"]  # the service of the same name
    assert timer["Install"]["WantedBy"] == ["timers.target"]  # what `systemctl enable` links it into
    service = unit("cni-reaper-sweep.service")
    assert "Install" not in service  # started by the timer only
    s = service["Service"]
    assert s["Type"] == ["oneshot"]
    # the host's network namespace (the rules are there), no traffic, a read-only system, the netns files,
    # /proc and the libcni cache visible
    assert "PrivateNetwork" not in s and "ProtectProc" not in s and "ProcSubset" not in s
    assert s["ProtectSystem"] == ["strict"] and s["IPAddressDeny"] == ["any"] and s["NoNewPrivileges"] == ["yes"]
    assert set(s["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6"}
    hidden = {k for k, v in s.items() if k in ("InaccessiblePaths", "TemporaryFileSystem", "BindPaths") and v}
    assert not hidden, hidden


def _shipped_command() -> tuple[list[str], dict[str, str], list[str], list[str]]:
    """The service's ExecStartPre (run with full privileges, '+') and ExecStart command lines, its
    Environment=, ReadWritePaths= and capability bounding set."""
    s = unit("cni-reaper-sweep.service")["Service"]
    pre = [shlex.split(v[1:]) for v in s.get("ExecStartPre", []) if v.startswith("+")]
    [start] = s["ExecStart"]
    env = dict(shlex.split(e)[0].split("=", 1) for e in s["Environment"])
    rw = " ".join(s["ReadWritePaths"]).split()
    caps = s["CapabilityBoundingSet"][0].split()
    return [*map(shlex.join, pre), start], env, rw, caps


@pytest.fixture(params=["nft", "legacy"])
def sandbox(request, tmp_path):
    with open_sandbox(tmp_path, request.param, binary_exe(), DEBIAN12) as sb:
        yield sb


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def hardening(rw: list[str]) -> str:
    """Shell commands giving the mount namespace ProtectSystem=strict with these ReadWritePaths=: every
    mount but the API file systems read-only, then each listed path bound writable again ('-': if it
    exists)."""
    lines = ['awk \'{print $5}\' /proc/self/mountinfo | sort -u | while read -r m; do case "$m" in '
             '/proc|/proc/*|/sys|/sys/*|/dev|/dev/*) ;; *) mount -o remount,bind,ro "$m" 2>/dev/null || true ;; esac; done']
    for path in rw:
        optional, path = path.startswith("-"), path.lstrip("-")
        bind = f'mount --bind {path} {path} && mount -o remount,bind,rw {path}'
        lines.append(f'if [ -e {path} ]; then {bind}; fi' if optional else bind)
    return " && ".join(lines)


def test_the_service_sweeps_and_writes_the_metrics_as_shipped(sandbox, tmp_path):
    """The ExecStartPre and ExecStart lines of the shipped service, run on a client whose /opt/cni holds the
    plugin and the shipped custom-network conflist (a tmpfs over /opt), with /var/lib holding the sandbox's
    CNI state and node_exporter's textfile directory, in a private mount namespace where everything is
    read-only but the service's ReadWritePaths=, with its capability bounding set and no new privileges
    (setpriv): the dead attachment is cleaned, the live one kept, the textfile written where
    Environment= says."""
    commands, env, rw, caps = _shipped_command()
    conflist = sandbox.root / "custom-network.conflist"
    conflist.write_text((REPO / "conflist" / "custom-network.conflist").read_text())
    live, dead = unique("alloc-"), unique("alloc-")
    live_ns, dead_ns = sandbox.container(), sandbox.container()
    ips = {live: ips_of(sandbox.driver("add", live, live_ns, ("8080:80/tcp",), conflist)),
           dead: ips_of(sandbox.driver("add", dead, dead_ns, ("8081:80/tcp",), conflist))}
    sandbox.remove_container(dead_ns)
    live_rules = sandbox.residue("services", live, ips[live])
    assert live_rules and sandbox.residue("services", dead, ips[dead])

    var_lib = tmp_path / "var-lib"
    textfile = var_lib / env["TEXTFILE_DIR"].removeprefix("/var/lib/")
    textfile.mkdir(parents=True)
    (var_lib / "cni").mkdir()
    pre = (f"mount -t tmpfs none /opt && mkdir -p /opt/cni/bin /opt/cni/config && "
           f"ln -s {sandbox.plugin_dir / 'cni-reaper'} /opt/cni/bin/cni-reaper && cp {conflist} /opt/cni/config/ && "
           f"mount --bind {var_lib} /var/lib && mount --bind {sandbox.cni_dir} /var/lib/cni && "
           + " && ".join(commands[:-1]) + " && " + hardening(rw))
    bounding = ",".join(["-all", *("+" + c.removeprefix("CAP_").lower() for c in caps)])
    argv = ["setpriv", "--no-new-privs", "--inh-caps=-all", f"--bounding-set={bounding}", "--", *shlex.split(commands[-1])]
    proc = sandbox.run(argv, env=env, pre=pre)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sandbox.residue("services", dead, ips[dead]) == []
    assert sandbox.residue("services", live, ips[live]) == live_rules
    got = samples((textfile / "cni_reaper.prom").read_text())
    assert got[("cni_reaper_attachments_cleaned_total", (("network", "services"),))] == 1
    assert got[("cni_reaper_sweep_duration_seconds_count", (("verb", "sweep"),))] == 1
    lines = [json.loads(l) for l in (sandbox.var_log / "cni-reaper.log").read_text().splitlines()]
    assert any(l["msg"] == "removed" and l["containerID"] == dead and l["verb"] == "sweep" for l in lines)
