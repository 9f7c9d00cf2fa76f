"""The scheduler's word (issue 34) through go-cni with the reference plugins, both iptables flavours, the
oldest and the newest stack: `cni-reaper sweep --nomad` asks a stand-in of the local Nomad agent's HTTP API
(testkit/nomad_standin.py, on a unix socket, as NOMAD_ADDR=unix://... reaches an agent) which allocations are
over.

- An allocation that completed while its client was down (Nomad #11096: its netns still mounted, nothing
  running in it) loses its rules on the next sweep; its reservation and record stay while its namespace holds
  the address, and with --nomad-remove-netns the namespace goes and then everything else. An allocation in the
  same state that the agent says is running keeps every line and its reservation, byte-identical.
- Every answer short of proof (an error, a timeout, a redirect, a server, another host's client) removes
  nothing, and the CLI exits 6 saying why. Without --nomad the sweep is what it was.
- A static-IPAM network's dead attachment, left for the runtime's DEL or GC on local evidence, is cleaned on
  the scheduler's word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from testkit.nomad_standin import client_dir, serving_agent
from testkit.sandbox import ips_of

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
NODE = "5d5ed6c4-7b4b-43a0-9b59-8d9b2f7a3c11"


@pytest.fixture
def agent(tmp_path):
    with serving_agent(tmp_path, NODE) as a:
        yield a


def sweep(sb, agent, *flags: str, env: dict[str, str] | None = None):
    argv = [str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", *flags, "--cni-conf-dir", str(sb.root / "none"),
            "--log-file", str(sb.log_file)]
    return sb.run(argv, env={"NOMAD_ADDR": agent.serving.address, **(env or {})})


def allocation(sb, port: int, conflist=None) -> tuple[str, list[str], str]:
    cid, netns = str(uuid.uuid4()), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, (f"{port}:80/tcp", f"{port}:80/udp"), conflist))
    return cid, ips, netns


def test_an_allocation_over_by_the_agents_word_loses_its_rules_then_its_namespace_and_reservation(sb, agent):
    done, done_ips, done_ns = allocation(sb, 8080)
    running, running_ips, running_ns = allocation(sb, 8081)
    agent.allocation(done, "complete")
    agent.allocation(running, "running")
    keep = sb.snapshot(NET, running, running_ips)
    assert keep[0] and keep[1]
    assert [l for l in sb.residue(NET, done, done_ips) if not l.startswith("reservation")]

    # without --nomad: both look live (their namespaces are there), nothing changes
    plain = sweep(sb, agent)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert not [p for p, _ in agent.seen]
    assert [l for l in sb.residue(NET, done, done_ips) if not l.startswith("reservation")]

    first = sweep(sb, agent, "--nomad")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "complete" in first.stderr and "record kept" in first.stderr, first.stderr
    assert sb.residue(NET, done, done_ips) == [f"reservation {ip}" for ip in done_ips], "its rules stay"
    assert os.path.exists(done_ns), "its namespace was removed without --nomad-remove-netns"
    assert sb.record(done) is not None
    assert sb.snapshot(NET, running, running_ips) == keep

    second = sweep(sb, agent, "--nomad", "--nomad-remove-netns")
    assert second.returncode == 0, second.stdout + second.stderr
    assert not os.path.exists(done_ns)
    if sb.residue(NET, done, done_ips):  # the kernel took its veth after the sweep looked: the next one frees it
        third = sweep(sb, agent, "--nomad")
        assert third.returncode == 0, third.stdout + third.stderr
    assert sb.residue(NET, done, done_ips) == [] and sb.record(done) is None
    assert sb.snapshot(NET, running, running_ips) == keep
    assert os.path.exists(running_ns)
    logged = [json.loads(l)["msg"] for l in sb.log_file.read_text().splitlines()]
    assert "namespace removed" in logged
    journal = sb.cli("journal", done).stdout
    assert f"network namespace {done_ns} removed on Nomad's word (cannot be put back)" in journal, journal
    undo = sb.cli("undo", done, "--dry-run")
    assert "cannot be put back" in undo.stdout + undo.stderr, undo.stdout + undo.stderr
    metrics = sb.cli("metrics").stdout
    assert f'cni_reaper_schedulers_word_total{{network="{NET}",kind="attachments"}} 1' in metrics, metrics
    assert "cni_reaper_schedulers_word_unavailable_timestamp_seconds 0.0\n" in metrics, metrics
    assert "cni_reaper_schedulers_word_answered_timestamp_seconds 0.0\n" not in metrics, metrics
    assert f'cni_reaper_schedulers_word_total{{network="{NET}",kind="namespaces"}} 1' in metrics, metrics


def test_doctor_says_whether_the_agent_can_be_taken_at_its_word(sb, agent):
    env = {"NOMAD_ADDR": agent.serving.address}
    argv = [str(sb.plugin_dir / "cni-reaper"), "doctor", "--nomad", "--json", "--cni-conf-dir", str(sb.root / "none")]
    good = json.loads(sb.run(argv, env=env).stdout)
    found = [f for f in good["findings"] if f["check"] == "nomad"]
    assert len(found) == 1 and found[0]["status"] == "OK" and NODE in found[0]["message"], found
    agent.fail["/v1/agent/self"] = (403, "Permission denied", {})
    bad = sb.run(argv, env=env)
    found = [f for f in json.loads(bad.stdout)["findings"] if f["check"] == "nomad"]
    assert bad.returncode == 5 and found[0]["status"] == "FAIL" and "403" in found[0]["message"], found
    plain = json.loads(sb.run(argv[:2] + argv[3:], env=env).stdout)
    assert not [f for f in plain["findings"] if f["check"] == "nomad"]


@pytest.mark.parametrize("recorded", ["identity", "path only"])
@pytest.mark.parametrize("status", ["complete", "failed"])
def test_a_process_in_the_namespace_outweighs_the_word(sb, agent, status, recorded):
    """Nomad says `failed` as soon as one task failed, while a sibling (or a poststop task) may still run in
    the allocation's namespace; servers say `lost` of a client that still runs it. A process in the namespace
    keeps everything of the allocation, byte-identical, and the sweep says why (exit 6)."""
    done, done_ips, done_ns = allocation(sb, 8082)
    agent.allocation(done, status)
    if recorded == "path only":  # its ADD could not look at the namespace: the one at its path now is asked about
        sb.edit_record(done, lambda rec: rec["current"].update(netnsId=None))
    before = sb.snapshot(NET, done, done_ips)
    holder = sb.serve(done_ns, 80, "still here")
    try:
        out = sweep(sb, agent, "--nomad", "--nomad-remove-netns")
        assert out.returncode == 6 and "a process is in its network namespace" in out.stderr, out.stdout + out.stderr
        assert os.path.exists(done_ns)
        assert sb.snapshot(NET, done, done_ips) == before
    finally:
        holder.kill()
        holder.wait()


SETNS_THREAD = r"""
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def inside():
    fd = os.open(sys.argv[1], os.O_RDONLY)
    assert libc.setns(fd, 0x40000000) == 0, ctypes.get_errno()
    os.close(fd)
    print("in", flush=True)
    time.sleep(120)
threading.Thread(target=inside, daemon=True).start()
time.sleep(120)
"""
HOLD_FD = "import os,sys,time\nfd=os.open(sys.argv[1],os.O_RDONLY)\nprint('in',flush=True)\ntime.sleep(120)"


@pytest.mark.parametrize("holder", ["a thread", "a descriptor"])
def test_a_namespace_something_else_holds_is_not_removed(sb, agent, holder):
    """One thread of a process entered the namespace (Go's netns.Do, a plugin mid-call: /proc/PID/ns/net is
    the main thread's and says nothing), or a process outside holds a descriptor of it: removing its mount
    would leave the namespace, its interface and its address alive with no path. A thread keeps everything;
    a descriptor keeps the namespace and the reservation."""
    done, done_ips, done_ns = allocation(sb, 8089)
    agent.allocation(done, "complete")
    before = sb.snapshot(NET, done, done_ips)
    code = SETNS_THREAD if holder == "a thread" else HOLD_FD
    p = subprocess.Popen([sys.executable, "-c", code, done_ns], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "in"
    try:
        out = sweep(sb, agent, "--nomad", "--nomad-remove-netns")
        assert out.returncode == 6, out.stdout + out.stderr
        assert os.path.exists(done_ns) and sb.record(done) is not None
        if holder == "a thread":
            assert sb.snapshot(NET, done, done_ips) == before
        else:
            assert "holds a descriptor of it" in out.stderr, out.stderr
            assert sb.residue(NET, done, done_ips) == [f"reservation {ip}" for ip in done_ips]
    finally:
        p.kill()
        p.wait()


def test_a_sweep_on_the_word_never_holds_the_state_lock_long(sb, agent):
    """Five allocations over whose veths outlive the removal of their namespaces' mounts (the kernel frees
    them later): the sweep does not wait for them under the state lock; an ADD beside it is not held up."""
    allocs = [allocation(sb, 8100 + i) for i in range(5)]
    for cid, _, _ in allocs:
        agent.allocation(cid, "complete")
    sw = sb.popen([str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--nomad", "--nomad-remove-netns",
                   "--cni-conf-dir", str(sb.root / "none"), "--log-file", str(sb.log_file)],
                  env={"NOMAD_ADDR": agent.serving.address})
    started = time.monotonic()
    add = sb.driver("add", str(uuid.uuid4()), sb.container(), ("8099:80/tcp",))
    took = time.monotonic() - started
    sw.communicate(timeout=120)
    assert add.returncode == 0 and took < 5, (took, add.stderr[-600:])
    assert sw.returncode == 0


def test_a_container_of_another_runtime_with_an_allocation_shaped_id_is_no_forgotten_allocation(sb, agent):
    """Nomad names an allocation's netns after it (/var/run/netns/<allocation ID>); a container of another
    runtime with a UUID for an ID that Nomad does not know keeps everything. One at a path Nomad would have
    made, that Nomad does not know either, is over."""
    other, other_ips, _ = allocation(sb, 8112)
    before = sb.snapshot(NET, other, other_ips)
    forgotten = str(uuid.uuid4())
    subprocess.run(["ip", "netns", "add", forgotten], check=True)
    sb.containers.append(forgotten)
    forgotten_ips = ips_of(sb.driver("add", forgotten, f"/var/run/netns/{forgotten}", ("8113:80/tcp",)))
    sb.remove_container(f"/var/run/netns/{forgotten}")  # gone, but static-like: the word is what cleans its rules here
    out = sweep(sb, agent, "--nomad")
    assert out.returncode == 0, out.stdout + out.stderr
    assert sb.snapshot(NET, other, other_ips) == before
    assert sb.residue(NET, forgotten, forgotten_ips) == []


@pytest.mark.parametrize("failure", ["403", "500", "timeout", "redirect", "server", "another-host"])
def test_an_answer_short_of_proof_removes_nothing_and_says_why(sb, agent, failure, tmp_path):
    done, done_ips, _ = allocation(sb, 8083)
    gone, gone_ips, gone_ns = allocation(sb, 8084)
    agent.allocation(done, "complete")
    sb.remove_container(gone_ns)  # dead on local evidence: cleaned whatever Nomad says
    before = sb.snapshot(NET, done, done_ips)
    if failure in ("403", "500"):
        agent.fail["/v1/agent/self"] = (int(failure), "Permission denied" if failure == "403" else "No cluster leader", {})
    elif failure == "redirect":
        agent.fail[f"/v1/node/{NODE}/allocations"] = (307, "", {"Location": "http://10.1.2.3:4646/"})
    elif failure == "timeout":
        agent.delay = 3.0
    elif failure == "server":
        agent.client = False
    else:
        client_dir(agent.data_dir, "0b7c2d8e-0000-4000-8000-000000000001")
    out = sweep(sb, agent, "--nomad", "--nomad-remove-netns")
    assert out.returncode == 6 and "Nomad: " in out.stderr, out.stdout + out.stderr
    assert sb.snapshot(NET, done, done_ips) == before
    assert sb.residue(NET, gone, gone_ips) == []
    # the word unavailable, for the shipped alert (build/monitoring): its time, and never an answer
    metrics = sb.cli("metrics").stdout
    assert "cni_reaper_schedulers_word_answered_timestamp_seconds 0.0\n" in metrics, metrics
    assert "cni_reaper_schedulers_word_unavailable_timestamp_seconds 0.0\n" not in metrics, metrics


def test_a_static_ipam_attachment_left_for_the_runtime_is_cleaned_on_the_schedulers_word(sb, agent):
    data = json.loads(sb.shipped().read_text())
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["ipam"] = {"type": "static", "addresses": [{"address": "10.77.0.5/24"}]}
            p["bridge"] = "static0"
    path = sb.root / "static.json"
    path.write_text(json.dumps(data))
    conflist = sb.conflist(path, name="static-net")
    cid, ips, netns = allocation(sb, 8085, conflist)
    sb.remove_container(netns)
    lines = sb.residue("static-net", cid, ips)
    assert lines
    left = sweep(sb, agent)
    assert sb.residue("static-net", cid, ips) == lines, left.stdout + left.stderr
    agent.allocation(cid, "failed")
    out = sweep(sb, agent, "--nomad")
    assert out.returncode == 0, out.stdout + out.stderr
    assert sb.residue("static-net", cid, ips) == [] and sb.record(cid) is None


def test_observe_mode_removes_nothing_on_the_word_not_even_the_namespace(sb, agent):
    done, done_ips, done_ns = allocation(sb, 8086)
    agent.allocation(done, "complete")
    before = sb.snapshot(NET, done, done_ips)
    conf_dir = sb.root / "observe-conf"
    conf_dir.mkdir()
    (conf_dir / "nomad-reaper.conflist").write_text(sb.conflist(mode="observe").read_text())
    argv = [str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--nomad", "--nomad-remove-netns",
            "--cni-conf-dir", str(conf_dir), "--log-file", str(sb.log_file)]
    out = sb.run(argv, env={"NOMAD_ADDR": agent.serving.address})
    assert out.returncode == 3 and "observe mode" in out.stdout, out.stdout + out.stderr
    assert os.path.exists(done_ns)
    assert sb.snapshot(NET, done, done_ips) == before


def test_an_allocation_whose_del_is_in_flight_is_left_to_its_del(sb, agent):
    """cni-reaper's DEL ran (it is first in a DEL) and the chain's other DELs have not yet: its tombstone is
    judged as ever (the DEL may be in flight), whatever Nomad says; racing portmap's and bridge's DELs for the
    same rules could fail the runtime's DEL."""
    done, done_ips, done_ns = allocation(sb, 8087)
    agent.allocation(done, "complete")
    conf = json.loads(sb.conflist().read_text())
    rc, _, err = sb.plugin("DEL", dict(conf["plugins"][-1], cniVersion="1.0.0", name=conf["name"]), cid=done,
                           netns=done_ns)
    assert rc == 0, err
    before = sb.snapshot(NET, done, done_ips)
    assert before[0]
    out = sweep(sb, agent, "--nomad", "--nomad-remove-netns")
    assert out.returncode == 0, out.stdout + out.stderr
    assert sb.snapshot(NET, done, done_ips) == before and os.path.exists(done_ns)


def test_a_namespace_that_cannot_be_removed_from_here_keeps_its_reservation(sb, agent):
    """The sweep runs where the netns directory is read-only (as the timer's service: ProtectSystem=strict, a
    mount namespace of its own): the unmount succeeds in its own view, the unlink does not. The namespace is
    still there on the host, so the allocation keeps its reservation and record; only its rules go."""
    done, done_ips, done_ns = allocation(sb, 8088)
    agent.allocation(done, "complete")
    argv = [str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--nomad", "--nomad-remove-netns",
            "--cni-conf-dir", str(sb.root / "none"), "--log-file", str(sb.log_file)]
    ro = f"mount -o remount,bind,ro {os.path.dirname(done_ns)}"
    out = sb.run(argv, env={"NOMAD_ADDR": agent.serving.address}, pre=ro)
    # (or, with another mount namespace of this machine holding the namespace at another path, as a chroot's
    # bind of /run does, refused before it tries: the same outcome, for another stated reason)
    assert out.returncode == 6 and ("cannot remove" in out.stderr or "too" in out.stderr), out.stdout + out.stderr
    assert os.stat(done_ns).st_ino != os.stat(os.path.dirname(done_ns)).st_ino
    assert sb.residue(NET, done, done_ips) == [f"reservation {ip}" for ip in done_ips]
    assert sb.record(done) is not None


IN_AND_OUT = r"""
import ctypes, os, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
home, there = os.open("/proc/self/ns/net", os.O_RDONLY), os.open(sys.argv[1], os.O_RDONLY)
assert libc.setns(there, 0x40000000) == 0
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9999))
assert libc.setns(home, 0x40000000) == 0
os.close(there)
print("out", flush=True)
time.sleep(120)
"""


def test_a_namespace_only_a_socket_holds_keeps_its_address_after_its_mount_went(sb, agent):
    """A process entered the namespace, made a socket there and left (as Docker's libnetwork and monitoring
    agents do): no thread, descriptor of it or mount holds it that /proc shows, and its mount is removed; the
    namespace lives on with its veth, so the reservation and the record stay (exit 0, said)."""
    done, done_ips, done_ns = allocation(sb, 8114)
    agent.allocation(done, "complete")
    p = subprocess.Popen([sys.executable, "-c", IN_AND_OUT, done_ns], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "out"
    try:
        out = sweep(sb, agent, "--nomad", "--nomad-remove-netns")
        assert out.returncode == 0 and "record kept" in out.stderr, out.stdout + out.stderr
        assert not os.path.exists(done_ns)
        assert sb.residue(NET, done, done_ips) == [f"reservation {ip}" for ip in done_ips]
        assert sb.record(done) is not None
        again = sweep(sb, agent, "--nomad")
        assert again.returncode == 0 and sb.record(done) is not None, again.stdout + again.stderr
        assert sb.residue(NET, done, done_ips) == [f"reservation {ip}" for ip in done_ips]
    finally:
        p.kill()
        p.wait()


def test_a_namespace_without_a_recorded_veth_is_not_removed(sb, agent):
    """A chain without a veth (macvlan, ipvlan): nothing would show its namespace gone after its mount went
    (a socket made inside keeps it unseen), so it is kept, with its reservation; its rules go."""
    done, done_ips, done_ns = allocation(sb, 8115)
    agent.allocation(done, "complete")
    sb.edit_record(done, lambda rec: rec["current"].update(veth=None))
    out = sweep(sb, agent, "--nomad", "--nomad-remove-netns")
    assert out.returncode == 6 and "no veth was recorded to show it gone" in out.stderr, out.stdout + out.stderr
    assert os.path.exists(done_ns)
    assert sb.residue(NET, done, done_ips) == [f"reservation {ip}" for ip in done_ips]
