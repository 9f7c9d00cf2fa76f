"""Wrap mode at its edges (found by a red team): the wrapper is portmap to the runtime even where portmap's
own run is unusual (huge or closed stdin, a closed stdout, a plugin that cannot be executed or dies of a
signal), never loops when two cni-reapers wrap on one path, never hangs on its settings file, keeps within
wrapTimeout whatever locks it meets, writes nothing of its own on the real plugin's stderr; and a network in
observe mode is never cleaned by another network's sweep, whether or not anything was stale in its own calls.
Through go-cni with Nomad's bridge conflist, both iptables flavours."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import time

import pytest

from testkit.nomad import Client, bridge_conflist
from testkit.sandbox import ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NET = "nomad"


def _add_request(padding: int = 0) -> tuple[dict, str]:
    conf = {"cniVersion": "0.4.0", "name": NET, "type": "portmap", "snat": True,
            "capabilities": {"portMappings": True}, "runtimeConfig": {"portMappings": []},
            "prevResult": {"cniVersion": "0.4.0", "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
                           "ips": [{"version": "4", "address": "172.26.64.9/20", "interface": 0}]}}
    if padding:
        conf["padding"] = "x" * padding
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "alloc-x", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0"}
    return env, json.dumps(conf)


def _both(sb, client, env: dict, stdin: str | None, shell: str = "") -> tuple:
    """(direct, wrapped): the real portmap and the wrapper run on the same request (`shell`: redirections)."""
    direct = sb.run(["sh", "-c", f'"$0" {shell}', str(sb.plugins / "portmap")],
                    env={**env, "CNI_PATH": str(sb.plugins)}, input=stdin)
    wrapped = sb.run(["sh", "-c", f'"$0" {shell}', str(client.wrap / "portmap")],
                     env={**env, "CNI_PATH": sb.plugin_path}, input=stdin)
    return direct, wrapped


def test_stdin_past_any_limit_reaches_the_real_plugin_whole(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        env, stdin = _add_request(padding=17 << 20)
        direct, wrapped = _both(sb, client, env, stdin)
        assert direct.returncode == 0, direct.stdout
        assert (wrapped.returncode, wrapped.stdout) == (direct.returncode, direct.stdout)


@pytest.mark.parametrize("shell", ["0<&-", ">&-", "0</dev/null"], ids=["stdin-closed", "stdout-closed", "stdin-empty"])
@pytest.mark.parametrize("command", ["VERSION", "ADD"])
def test_closed_streams_give_portmaps_answer_never_a_traceback(tmp_path, flavour, package_exe, shell, command):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        env, _ = _add_request()
        env["CNI_COMMAND"] = command
        direct, wrapped = _both(sb, client, env, None, shell)
        assert "Traceback" not in wrapped.stderr and "Error:" not in wrapped.stderr, wrapped.stderr
        assert wrapped.returncode == direct.returncode, (direct, wrapped)
        assert wrapped.stdout == direct.stdout
        # and cni-reaper chained (not wrapped) with the same streams: a CNI answer or exit 1, no traceback
        chained = sb.run(["sh", "-c", f'"$0" {shell}', str(sb.plugin_dir / "cni-reaper")], env=env)
        assert "Traceback" not in chained.stderr and chained.returncode in (0, 1), chained.stderr


def _fake_portmap(sb, body: bytes) -> str:
    d = sb.root / "fake-plugins"
    d.mkdir(exist_ok=True)
    (d / "portmap").write_bytes(body)
    (d / "portmap").chmod(0o755)
    return str(d)


def test_a_real_plugin_that_cannot_be_executed_is_a_cni_error(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        fake = _fake_portmap(sb, b"\x7fELF not really\n")
        env, stdin = _add_request()
        out = sb.run([str(client.wrap / "portmap")], env={**env, "CNI_PATH": f"{client.wrap}:{fake}"}, input=stdin)
        assert out.returncode == 1, out
        err = json.loads(out.stdout)
        assert err["code"] == 5 and "cannot be run" in err["msg"] and "Exec format error" in err["msg"], err


def test_a_real_plugin_killed_by_a_signal_kills_the_wrapper_alike_and_runs_with_default_signals(tmp_path, flavour,
                                                                                                package_exe):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        env, stdin = _add_request()
        fake = _fake_portmap(sb, b"#!/bin/sh\ngrep -E '^Sig(Ign|Blk)' /proc/self/status\n[ -n \"$DIE\" ] && kill -SEGV $$\nexit 0\n")
        direct = sb.run(["sh", "-c", 'exec "$0"', f"{fake}/portmap"], env=env, input=stdin)
        wrapped = sb.run(["sh", "-c", 'exec "$0"', str(client.wrap / "portmap")],
                         env={**env, "CNI_PATH": f"{client.wrap}:{fake}"}, input=stdin)
        assert (wrapped.returncode, wrapped.stdout) == (direct.returncode, direct.stdout)  # SIGPIPE, SIGXFSZ default
        died = sb.run(["sh", "-c", 'exec "$0"', f"{fake}/portmap"], env={**env, "DIE": "1"}, input=stdin)
        dying = sb.run(["sh", "-c", 'exec "$0"', str(client.wrap / "portmap")],
                       env={**env, "CNI_PATH": f"{client.wrap}:{fake}", "DIE": "1"}, input=stdin)
        assert died.returncode == -11 and dying.returncode == -11, (died, dying)  # killed by SIGSEGV, both


def test_two_cni_reapers_wrapping_on_one_path_do_not_loop(tmp_path, flavour, package_exe):
    """A .deb's wrapper directory and a tarball's (or an old copy's), each linking portmap to its own
    cni-reaper, both on the path: the call reaches the real portmap once, and the attachment is recorded once."""
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        other = sb.root / "other"
        other.mkdir()
        shutil.copy2(os.path.realpath(sb.plugin_dir / "cni-reaper"), other / "cni-reaper")
        (other / "wrap").mkdir()
        (other / "wrap" / "portmap").symlink_to(other / "cni-reaper")
        sb.plugin_path = f"{client.wrap}:{other / 'wrap'}:{sb.plugin_dir}:{sb.plugins}"
        cid, netns = unique("alloc-"), sb.container()
        started = time.monotonic()
        add = client.driver("add", cid, netns, ("8080:80/tcp",))
        assert add.returncode == 0, add.stderr[-2000:]
        assert time.monotonic() - started < 30  # a hang detector: a loop never answers
        assert [r["containerID"] for r in sb.records()] == [cid]
        assert client.driver("del", cid, netns, ("8080:80/tcp",)).returncode == 0


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_settings_file_that_is_no_regular_file_never_hangs_a_call(tmp_path, flavour, package_exe, kind):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        client.settings.unlink()
        os.mkfifo(client.settings) if kind == "fifo" else client.settings.mkdir()
        env, stdin = _add_request()
        for command in ("", "VERSION", "ADD"):
            env["CNI_COMMAND"] = command
            direct, wrapped = _both(sb, client, {k: v for k, v in env.items() if v}, stdin)
            assert (wrapped.returncode, wrapped.stdout) == (direct.returncode, direct.stdout), command
        cli = sb.run([str(sb.plugin_dir / "cni-reaper"), "list", "--config", str(client.settings)], timeout=30)
        assert "not a regular file" in cli.stderr, cli.stderr
        assert stat.S_ISFIFO(os.stat(client.settings).st_mode) or kind == "directory"


def test_the_wrappers_own_lines_go_to_its_log_not_to_the_real_plugins_stderr(tmp_path, flavour, package_exe):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        cid, netns = unique("alloc-"), sb.container()
        add = client.driver("add", cid, netns, ("8080:80/tcp",))
        assert add.returncode == 0
        sb.remove_container(netns)
        other = client.driver("add", unique("alloc-"), sb.container(), ("8081:80/tcp",))
        assert other.returncode == 0
        assert '"level"' not in add.stderr + other.stderr, other.stderr
        assert '"msg": "removed"' in sb.log_file.read_text() or '"msg":"removed"' in sb.log_file.read_text()


def _obs_conflist(sb) -> str:
    doc = bridge_conflist()
    doc["name"] = "obs"
    for p in doc["plugins"]:
        if p["type"] == "bridge":
            p["bridge"] = "obs0"
            p["ipam"]["ranges"] = [[{"subnet": "10.124.0.0/24"}]]
    path = sb.root / "obs.conflist"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_network_in_observe_mode_is_not_cleaned_by_another_networks_sweep(tmp_path, flavour, package_exe):
    """Its mode is said by every call of its own, stale or not: the first ADD of an observed network, with
    nothing stale, is enough for the clean network's next sweep to leave its dead attachments."""
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb, settings={"networks": {"obs": {"mode": "observe"}}})
        obs = _obs_conflist(sb)
        dead, ns = unique("alloc-"), sb.container()
        ips = ips_of(sb.driver("add", dead, ns, ("8083:80/tcp",), obs))
        kept = sb.residue("obs", dead, ips)
        sb.remove_container(ns)
        assert client.driver("add", unique("alloc-"), sb.container(), ("8084:80/tcp",)).returncode == 0
        assert sb.residue("obs", dead, ips) == kept and kept
        assert dead in {r["containerID"] for r in sb.records()}


def test_wraptimeout_holds_whatever_locks_the_sweep_meets(tmp_path, flavour, package_exe):
    """host-local's locks of a clean and of an observed network held by someone else, each with a dead
    attachment: the wrapped call answers within wrapTimeout (1 s) and the plugin's time, not lockTimeout's."""
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb, settings={"wrapTimeout": 1, "lockTimeout": 30, "networks": {"obs": {"mode": "observe"}}})
        obs = _obs_conflist(sb)
        dead_a, ns_a, dead_b, ns_b = unique("alloc-"), sb.container(), unique("alloc-"), sb.container()
        assert client.driver("add", dead_a, ns_a, ("8082:80/tcp",)).returncode == 0
        assert sb.driver("add", dead_b, ns_b, ("8083:80/tcp",), obs).returncode == 0
        sb.remove_container(ns_b)
        assert sb.driver("add", unique("alloc-"), sb.container(), (), obs).returncode == 0  # obs's sweep sees dead_b
        sb.remove_container(ns_a)
        holders = []
        try:
            for network in ("nomad", "obs"):
                lock = sb.run_cni / network / "lock"
                holders.append(open(lock, "a"))  # noqa: SIM115 - held across the call below, closed in finally
                fcntl.flock(holders[-1], fcntl.LOCK_EX)
            env, stdin = _add_request()
            env.update(CNI_COMMAND="DEL", CNI_CONTAINERID="alloc-other")
            started = time.monotonic()
            out = sb.run([str(client.wrap / "portmap")], env={**env, "CNI_PATH": sb.plugin_path}, input=stdin,
                         timeout=120)
            took = time.monotonic() - started
            assert out.returncode == 0, out
            assert took < 15, f"the wrapped DEL took {took:.1f} s (wrapTimeout 1 s, lockTimeout 30 s)"
        finally:
            for h in holders:
                h.close()
        assert "wrapTimeout" in sb.log_file.read_text()


def test_a_settings_file_named_but_missing_is_an_error_and_an_empty_path_is_said(tmp_path, flavour, package_exe):
    """`--config` names the file where an operator set observe mode: a typo must not fall back to the defaults."""
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        cli = sb.run([str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--config", str(sb.root / "typo.json")])
        assert cli.returncode == 1 and "no such file" in cli.stderr, cli
        env, stdin = _add_request()
        out = sb.run([str(client.wrap / "portmap")], env={**env, "CNI_PATH": ":"}, input=stdin)
        assert out.returncode == 1 and json.loads(out.stdout)["code"] == 5 and "(an empty path)" in out.stdout, out


@pytest.mark.parametrize("where", ["network", "top"])
def test_observe_mode_set_in_the_settings_file_is_kept_by_every_networks_sweep(tmp_path, flavour, package_exe, where):
    """Issue 32, case 3: a wrapped network was served in clean mode (the state directory says clean), then the
    operator sets observe in the settings file (`networks.obs.mode`, or the top-level `mode`) and one of its
    allocations dies. The next ADD on another wrapped network reads that file: it removes nothing of the
    observed network (rules and reservation stay), and says what it would. On 0.4.0 it removed them all,
    judging the observed network's mode from the state directory alone."""
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        client = Client(sb)
        obs = _obs_conflist(sb)
        dead, ns = unique("alloc-"), sb.container()
        ips = ips_of(sb.driver("add", dead, ns, ("8083:80/tcp",), obs))
        kept = sb.residue("obs", dead, ips)
        assert kept and any(l.startswith("reservation") for l in kept)
        observe = {"networks": {"obs": {"mode": "observe"}}} if where == "network" else {"mode": "observe"}
        client.settings.write_text(json.dumps({"logFile": str(sb.log_file), **observe}))
        sb.remove_container(ns)
        assert client.driver("add", unique("alloc-"), sb.container(), ("8084:80/tcp",)).returncode == 0
        assert sb.residue("obs", dead, ips) == kept
        assert dead in {r["containerID"] for r in sb.records()}
        lines = [json.loads(l) for l in sb.log_file.read_text().splitlines()]
        assert [l for l in lines if l["msg"] == "would remove" and l.get("containerID") == dead], lines[-5:]
        assert not [l for l in lines if l["msg"] == "removed" and l.get("containerID") == dead]
