"""Every identity and view judged as the namespace's, not the observer's (issue 32, cases 4, 5 and 7):

- a netns path that cannot be looked at (EACCES: a process without CAP_DAC_OVERRIDE, as the shipped timer's
  service runs, and a directory it may not search) is unknown, never gone: its attachment is neither
  cleaned nor marked, and the ADD, CHECK and DEL that meet it succeed;
- a log file that is a FIFO nobody reads (or any other file that is no regular one) never stalls a verb.

Direct plugin calls in a throwaway sandbox: the namespaces, the state and the log are the sandbox's."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from testkit.sandbox import ips_of, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
NO_DAC = ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", 'exec "$0"']


def conf(sb, ip: str, veth: str | None = None, **extra) -> dict:
    interfaces = [{"name": "eth0", "sandbox": "x"}] + ([{"name": veth}] if veth else [])
    prev = {"cniVersion": "1.0.0", "interfaces": interfaces, "ips": [{"address": f"{ip}/24", "interface": 0}]}
    return {"cniVersion": "1.0.0", "name": NET, "type": "cni-reaper", "logFile": str(sb.log_file),
            "capabilities": {"portMappings": True}, "prevResult": prev, **extra}


def call(sb, command: str, cid: str, netns: str, doc: dict, pre: str = "", no_dac: bool = False,
         timeout: float = 60) -> subprocess.CompletedProcess:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": "eth0",
           "CNI_PATH": f"{sb.plugin_dir}:{sb.plugins}"}
    argv = [*NO_DAC, str(sb.plugin_dir / "cni-reaper")] if no_dac else [str(sb.plugin_dir / "cni-reaper")]
    return sb.run(argv, env=env, input=json.dumps(doc), pre=pre, timeout=timeout)


def reserve(sb, ip: str, cid: str) -> None:
    d = sb.cni_dir / "networks" / NET
    d.mkdir(parents=True, exist_ok=True)
    (d / ip).write_text(f"{cid}\r\neth0")


def locked_netns(sb):
    """A directory holding a live namespace at `<dir>/ns`, and the shell commands (run first in each call's
    mount namespace) that bind the namespace there and make the directory unsearchable without
    CAP_DAC_OVERRIDE."""
    locked = sb.root / "locked"
    locked.mkdir()
    (locked / "ns").touch()
    return locked, f"mount --bind {sb.container()} {locked}/ns && chmod 000 {locked}"


def log_lines(sb) -> list[dict]:
    return [json.loads(l) for l in sb.log_file.read_text().splitlines()] if sb.log_file.exists() else []


def test_a_netns_path_that_cannot_be_looked_at_is_unknown_never_dead(sb):
    """A live attachment whose netns sits in a directory the sweeping process may not search (it runs without
    CAP_DAC_OVERRIDE): its own ADD, CHECK and the sweeps of others' calls keep it, with its reservation; the
    log says why it could not be judged. On 0.4.0 the ADD's own sweep judged it dead ("its netns is gone")."""
    locked, bind = locked_netns(sb)
    cid, ip = unique("alloc-"), "10.99.0.2"
    reserve(sb, ip, cid)
    add = call(sb, "ADD", cid, f"{locked}/ns", conf(sb, ip), pre=bind, no_dac=True)
    assert add.returncode == 0 and json.loads(add.stdout)["ips"][0]["address"] == f"{ip}/24", add.stdout + add.stderr
    check = call(sb, "CHECK", cid, f"{locked}/ns", conf(sb, ip), pre=bind, no_dac=True)
    assert check.returncode == 0, check.stdout + check.stderr
    other = unique("alloc-")
    reserve(sb, "10.99.0.3", other)
    again = call(sb, "ADD", other, sb.container(), conf(sb, "10.99.0.3"), pre=bind, no_dac=True)
    assert again.returncode == 0, again.stdout + again.stderr
    record = sb.record(cid)
    assert record is not None and "left" not in record, record
    assert (sb.cni_dir / "networks" / NET / ip).exists(), "a live attachment's reservation was released"
    mine = [l for l in log_lines(sb) if l.get("containerID") == cid or cid in str(l.get("why", ""))]
    assert not [l for l in mine if l["msg"] in ("record dropped", "removed", "left for the runtime's DEL or GC")], mine
    # the same attachment seen by a process that can look: alive
    out = sb.cli("list", "--json")
    states = {r["containerID"]: r["state"] for r in json.loads(out.stdout)}
    assert states[cid] in ("live", "unknown"), states
    os.chmod(locked, 0o755)


def test_a_mount_namespace_number_given_again_is_not_the_one_recorded(sb):
    """The runtime's ADD ran in a mount namespace that is gone now (a transient one: `ip netns exec`, a runtime
    restarted in a private one), and the kernel gave its inode number to the namespace a later sweep runs in.
    The netns is mounted only where the ADD was, so that sweep sees an empty file at its path: not its view,
    so the attachment is unknown to it, never dead. Before, the same number was taken for the same namespace,
    and `list` said dead and `sweep --apply` released the live allocation's reservation (CI, 2026-12-04:
    `ip netns exec` handed the number on)."""
    locked, bind = locked_netns(sb)
    cid, ip = unique("alloc-"), "10.99.0.6"
    reserve(sb, ip, cid)
    add = call(sb, "ADD", cid, f"{locked}/ns", conf(sb, ip), pre=bind)
    assert add.returncode == 0, add.stdout + add.stderr
    os.chmod(locked, 0o755)
    holder = sb.popen(["sleep", "600"], quiet=True)  # a mount namespace of the sandbox's, held
    try:
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{holder.pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            assert time.monotonic() < deadline, "the holder never entered its mount namespace"
            time.sleep(0.01)
        while os.readlink(f"/proc/{holder.pid}/exe").rsplit("/", 1)[-1] != "sleep":
            assert time.monotonic() < deadline, "the holder never became sleep"
            time.sleep(0.01)
        given = os.stat(f"/proc/{holder.pid}/ns/mnt").st_ino
        sb.edit_record(cid, lambda rec: rec["current"]["host"].update(mnt=given))
        enter = ["nsenter", "-t", str(holder.pid), "-m", "-n", str(sb.plugin_dir / "cni-reaper")]
        tail = ["--cni-conf-dir", str(sb.root / "none")]
        listed = subprocess.run([*enter, "list", "--json", *tail], env=sb.env(), text=True, capture_output=True)
        states = {r["containerID"]: (r["state"], r.get("why")) for r in json.loads(listed.stdout)}
        assert states[cid][0] in ("live", "unknown"), states
        swept = subprocess.run([*enter, "sweep", "--apply", *tail], env=sb.env(), text=True, capture_output=True)
        assert swept.returncode in (0, 6), swept.stdout + swept.stderr
    finally:
        holder.kill()
        holder.wait()
    assert (sb.cni_dir / "networks" / NET / ip).exists(), "a live attachment's reservation was released"
    record = sb.record(cid)
    assert record is not None and record["deleted"] is None and "left" not in record, record


def test_del_of_a_path_that_cannot_be_looked_at_succeeds(sb):
    locked, bind = locked_netns(sb)
    cid, ip = unique("alloc-"), "10.99.0.4"
    reserve(sb, ip, cid)
    assert call(sb, "ADD", cid, f"{locked}/ns", conf(sb, ip), pre=bind).returncode == 0
    dl = call(sb, "DEL", cid, f"{locked}/ns", conf(sb, ip), pre=bind, no_dac=True)
    assert dl.returncode == 0 and dl.stdout.strip() == "", dl.stdout + dl.stderr
    os.chmod(locked, 0o755)


@pytest.mark.parametrize("kind", ["fifo", "directory", "socket"])
def test_a_log_file_that_is_no_regular_file_never_stalls_a_verb(sb, kind):
    """logFile names a FIFO nobody reads (or a directory, a socket): ADD, CHECK, DEL and STATUS return at once,
    with their results, and write nothing there. On 0.4.0 an ADD blocked for good on the FIFO."""
    import socket

    where = sb.root / f"log-{kind}"
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "directory":
        where.mkdir()
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(where))
    cid, ip = unique("alloc-"), "10.99.0.5"
    netns = sb.container()
    doc = conf(sb, ip, logFile=str(where), capabilities={})  # no portMappings capability: the ADD warns
    started = time.monotonic()
    for command in ("ADD", "CHECK", "DEL"):
        proc = call(sb, command, cid, netns, doc, timeout=20)
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
    rc, _, err = sb.status(logFile=str(where))
    assert rc == 0, err
    assert time.monotonic() - started < 20
    if kind == "directory":
        assert list(where.iterdir()) == []


def test_a_boot_id_read_in_another_view_is_no_reboot(sb):
    """Issue 32, case 7: the runtime's ADD read the boot id of a container (a file mounted over /proc's, as
    systemd-nspawn gives one); the periodic sweep's service reads /proc's own (ProtectKernelTunables= remounts
    /proc/sys). Same host, same boot: the live allocation keeps every rule and its reservation. On 0.4.0 the
    sweep dropped its record and removed them all ("the host has booted since it was recorded")."""
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, ("8080:80/tcp", "8080:80/udp")))
    before = sb.residue(NET, cid, ips)
    assert before and any(l.startswith("reservation") for l in before)
    other_view = "umount /proc/sys/kernel/random/boot_id"
    out = sb.run([str(sb.plugin_dir / "cni-reaper"), "sweep", "--apply", "--cni-conf-dir", str(sb.root / "none")],
                 pre=other_view)
    assert out.returncode in (0, 4), out.stdout + out.stderr
    assert sb.residue(NET, cid, ips) == before, out.stdout + out.stderr
    assert sb.record(cid) is not None
    # and a real reboot, seen in the view the allocation was recorded in, still is one
    sb.reboot()
    assert sb.cli("sweep", "--apply").returncode in (0, 4)
    assert sb.residue(NET, cid, ips) == [] and sb.record(cid) is None
