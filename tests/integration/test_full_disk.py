"""cni-reaper's own bookkeeping on a file system that fills up (issue 43): the journal's intent is written
whole or nothing is removed."""

from __future__ import annotations

import json

import pytest

from testkit.mounts import fill, small_fs
from testkit.sandbox import ips_of, unique

pytestmark = pytest.mark.netns

NET = "nomad-reaper"


@pytest.fixture
def stack(two_stacks):
    return two_stacks


def test_a_clean_up_on_a_full_file_system_removes_nothing_it_could_not_journal(sb, tmp_path):
    """The journal's intent line does not fit in the state directory's file system (a page's slack is left):
    nothing of the dead allocation is removed, and `journal`/`undo` stay true; once there is room, the next
    sweep removes and journals it all, and undo can put it back. (Before: the line was cut at the slack, the
    clean-up went on, and `undo` said "nothing to put back".)"""
    with small_fs(tmp_path / "statefs", "512k") as fs:
        state = fs / "reaper"
        conflist = sb.conflist(stateDir=str(state))
        cli = ("--state-dir", str(state))
        first, netns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", first, netns, ("8096:80/tcp",), conflist))
        sb.remove_container(netns)
        dead, netns = unique("alloc-"), sb.container()
        ips = ips_of(sb.driver("add", dead, netns, ("8097:80/tcp",), conflist))
        # the journal exists (a first clean-up), then the file system is filled up to its pages' slack
        assert sb.cli("sweep", "--apply", *cli, "--network", NET).returncode == 0
        sb.remove_container(netns)
        before = sb.residue(NET, dead, ips)
        assert before
        fill(fs)
        out = sb.cli("sweep", "--apply", *cli)
        assert out.returncode in (0, 1, 4), out.stdout + out.stderr  # a clean-up that failed is said, never a traceback
        for line in (state / ".journal").read_bytes().splitlines():
            json.loads(line)  # no line cut short
        (fs / "filler").unlink()
        (fs / "filler-small").unlink()
        # whatever the full file system let go was journaled whole: undo puts all of it back
        undo = sb.cli("undo", dead, *cli)
        assert undo.returncode == 0, undo.stdout + undo.stderr
        assert sorted(sb.residue(NET, dead, ips)) == sorted(before), undo.stdout
        # with room, the next sweep removes and journals it all, and undo can put it back
        assert sb.cli("sweep", "--apply", *cli).returncode == 0
        assert sb.residue(NET, dead, ips) == []
        undo = sb.cli("undo", dead, *cli)
        assert undo.returncode == 0, undo.stdout + undo.stderr
        assert sorted(sb.residue(NET, dead, ips)) == sorted(before)


def test_a_full_state_directory_never_fails_an_allocation(sb, tmp_path):
    """Issue 43, item 3: the state directory's file system is full, host-local's has room. ADD and CHECK pass
    the chain's answer through (the allocation gets its traffic), the log says the attachment was not recorded,
    doctor fails its state-space check; once the allocation dies with no DEL, the orphan sweep cleans it as a
    leak from before installation (libcni's cache says its netns is gone). Before: the ADD failed with
    "cannot write record ... No space left on device"."""
    with small_fs(tmp_path / "statefs", "256k") as fs:
        state = fs / "reaper"
        conflist = sb.conflist(stateDir=str(state))
        warm, netns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", warm, netns, (), conflist))  # the state directory is made; then no room is left
        fill(fs)
        cid, netns = unique("alloc-"), sb.container()
        added = sb.driver("add", cid, netns, ("8098:80/tcp",), conflist)
        ips = ips_of(added)
        assert sb.reach(netns, "172.26.64.1", 8098, "served") == "served"
        rc, _, err = sb.plugin("CHECK", _reaper_conf(conflist, added.stdout), cid, netns)
        assert rc == 0, err
        assert "was not recorded" in sb.log_file.read_text()
        assert not any(r["containerID"] == cid for r in _records(state))
        doctor = sb.cli("doctor", "--state-dir", str(state))
        assert "state-space" in doctor.stdout and "FAIL" in doctor.stdout, doctor.stdout
        sb.remove_container(netns)
        (fs / "filler").unlink()
        (fs / "filler-small").unlink()
        out = sb.cli("sweep", "--apply", "--orphans", "--state-dir", str(state))
        assert out.returncode == 0, out.stdout + out.stderr
        assert sb.residue(NET, cid, ips) == [], out.stdout


def _reaper_conf(conflist, added: str) -> dict:
    """cni-reaper's own entry of `conflist`, as the runtime hands it a CHECK (the chain's result as prevResult)."""
    data = json.loads(conflist.read_text())
    entry = next(p for p in data["plugins"] if p["type"] == "cni-reaper")
    return {"cniVersion": data["cniVersion"], "name": data["name"], **entry, "prevResult": json.loads(added)[-1]}


def _records(state):
    return [json.loads(p.read_text()) for p in state.glob("r-*.json")]


def test_a_state_lock_held_by_another_process_never_fails_an_allocation(sb):
    """Never block an allocation for a lock someone else holds: an operator's long sweep keeps the state lock
    past the ADD's lockTimeout; the ADD passes the chain's answer through (unrecorded, logged) instead of
    failing with code 11."""
    import fcntl

    conflist = sb.conflist(lockTimeout=1)
    ips_of(sb.driver("add", unique("alloc-"), sb.container(), (), conflist))  # the state directory is there
    lock = open(sb.state_dir() / ".lock", "a")  # noqa: SIM115 - held across the ADD below
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cid, netns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", cid, netns, ("8099:80/tcp",), conflist, settle=False))
        assert sb.reach(netns, "172.26.64.1", 8099, "served") == "served"
        assert "was not recorded" in sb.log_file.read_text()
    finally:
        lock.close()
    sb.settle()


def test_an_add_answers_at_once_while_another_process_holds_the_state_lock_and_is_recorded_after(sb):
    """Never stall an allocation for a lock someone else holds: with the default lockTimeout (10 s) and the state
    lock held by another process (an operator's long sweep), the ADD answers within RECORD_WAIT (1 s) and its
    traffic flows; once the lock is free the attachment is recorded (after the answer), not lost."""
    import fcntl
    import time

    ips_of(sb.driver("add", unique("alloc-"), sb.container(), ()))  # the state directory is there
    lock = open(sb.state_dir() / ".lock", "a")  # noqa: SIM115 - held across the ADD below
    cid, netns = unique("alloc-"), sb.container()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        ips = ips_of(sb.driver("add", cid, netns, ("8098:80/tcp",), settle=False))
        took = time.monotonic() - started
        assert took < 5, f"the ADD took {took:.1f} s while the state lock was held (lockTimeout 10 s)"
        assert sb.reach(netns, "172.26.64.1", 8098, "served") == "served"
        assert sb.record(cid) is None and "recorded after the answer" in sb.log_file.read_text()
    finally:
        lock.close()
    sb.settle()
    record = sb.record(cid)
    assert record is not None, "the attachment was never recorded"
    assert sorted(i["address"] for i in record["current"]["ips"]) == sorted(i.split("/")[0] for i in ips)
    assert "was not recorded" not in sb.log_file.read_text()


@pytest.mark.parametrize("op", ["del", "check"])
def test_a_del_or_check_answers_at_once_while_another_process_holds_the_state_lock(sb, op):
    """The same for DEL and CHECK: the runtime's call answers within BRIEF_WAIT while another process holds the
    state lock (default lockTimeout, 10 s); cni-reaper's part runs once the lock is free: the DEL's record torn
    down (or dropped) and nothing of the allocation left, the CHECK's record kept."""
    import fcntl
    import time

    cid, netns = unique("alloc-"), sb.container()
    conflist = sb.conflist()
    added = sb.driver("add", cid, netns, ("8097:80/tcp",), conflist)
    ips = ips_of(added)
    lock = open(sb.state_dir() / ".lock", "a")  # noqa: SIM115 - held across the call below
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        if op == "del":  # the whole chain, as the runtime calls it
            done = sb.driver(op, cid, netns, ("8097:80/tcp",), conflist, settle=False, status=False)
            rc, err = done.returncode, done.stdout + done.stderr
        else:  # cni-reaper's CHECK alone (the plugins' own CHECK is theirs to pass), not waiting for its after-work
            env = {"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": "eth0",
                   "CNI_PATH": f"{sb.plugin_dir}:{sb.plugins}"}
            done = sb.run([str(sb.plugin_dir / "cni-reaper")], env=env, input=json.dumps(_reaper_conf(conflist, added.stdout)))
            rc, err = done.returncode, done.stderr
        took = time.monotonic() - started
        assert rc == 0, err
        assert took < 5, f"{op} took {took:.1f} s while the state lock was held (lockTimeout 10 s)" + \
            sb.log_file.read_text()[-2000:]
        assert "after the answer" in sb.log_file.read_text()
    finally:
        lock.close()
    sb.settle()
    record = sb.record(cid)
    if op == "del":
        assert record is None or record["deleted"] is not None
        assert sb.residue(NET, cid, ips) == []
    else:
        assert record is not None and record["deleted"] is None
