"""Red team rt43 (issue 43's promises, fixed last session): the journal, STATUS's lock wait, the bookkeeping
never failing a verb, native leaks from before installation, files of others, later schemas, the ADD's look."""

from __future__ import annotations

import json
import os

import pytest

from testkit.mounts import fill, small_fs
from testkit.sandbox import DEBIAN12, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns

NET = "nomad-reaper"


@pytest.fixture
def xsb(tmp_path, reaper_exe):
    """One sandbox (Debian 12's stack, iptables-nft) with the installed package, and with the release binary
    (dist/, or CNI_REAPER_BIN; skipped when there is none)."""
    with open_sandbox(tmp_path, "nft", reaper_exe, DEBIAN12) as s:
        yield s



def test_conntrack_entries_are_never_cleared_unjournaled_on_a_full_file_system(nsb, tmp_path):
    """Promise 1 (issue 43): every removal is journaled whole and fsynced BEFORE anything is removed; on a full
    file system nothing is removed unjournaled, and `journal <cid>` sees every removed item.

    Broken: reap/cleanup.py `_clear_conntrack` clears the dead address's conntrack entries first
    (conntrack.clear) and only then writes their journal item (`options.note(items)`), swallowing the OSError
    ("cleared already"). Reproduce: a dead attachment whose rules, reservation and cache entry are gone already
    (the chain's DEL ran without cni-reaper) but whose address still has a conntrack entry; the state
    directory's file system is full; `sweep --apply` clears the entry and the journal never says so."""
    sb = nsb
    with small_fs(tmp_path / "statefs", "256k") as fs:
        state = fs / "reaper"
        conflist = sb.conflist(stateDir=str(state))
        plain = sb.conflist(without_reaper=True)
        cli = ("--state-dir", str(state))
        cid, netns = unique("alloc-"), sb.container()
        ips = ips_of(sb.driver("add", cid, netns, ("8096:80/tcp",), conflist))
        ip = ips[0].split("/")[0]
        # the chain's own DEL, without cni-reaper: rules, reservation and cache entry go, the record stays
        assert sb.driver("del", cid, netns, ("8096:80/tcp",), plain).returncode == 0
        sb.remove_container(netns)
        sb.run(["conntrack", "-I", "-s", "10.210.0.1", "-d", ip, "-p", "udp", "--sport", "5353", "--dport", "53",
                "-t", "3000"], check=True)
        assert ip in sb.run(["conntrack", "-L"]).stdout
        assert not (state / ".journal").exists()
        fill(fs)
        out = sb.cli("sweep", "--apply", *cli)
        print(out.stdout, out.stderr)
        cleared = ip not in sb.run(["conntrack", "-L"]).stdout
        journal = sb.cli("journal", cid, *cli, "--json")
        said = [r for r in json.loads(journal.stdout or "[]") if r.get("kind") == "conntrack"]
        assert not cleared or said, (
            f"conntrack entries of {ip} were cleared and the journal does not say so:\n{out.stdout}{out.stderr}")


def _damage_index(state, count: int = 3) -> None:
    """`count` entries of `.index` that cannot be made (an entry of another length) under a valid checksum, for
    files of the directory that have record names: what Index._make raises Damaged (a ValueError) for."""
    from cni_reaper import jsonio
    from cni_reaper.state import index

    decoded = index.decode((state / ".index").read_bytes())
    assert isinstance(decoded, tuple), decoded
    hot, second = decoded
    for i in range(count):
        name = f"r-{'%040x' % (0xdead0000 + i)}.json"
        (state / name).write_text("{}\n")
        os.chmod(state / name, 0o600)
        hot["names"].append(name)
        hot["inos"].append(os.stat(state / name).st_ino)
        hot["attached"].append(f"x-{i}-eth0")
        hot["raw"].append([0])
    (state / ".index").write_bytes(index.seal(jsonio.dumps(hot).encode(), second[4:]))
    assert isinstance(index.decode((state / ".index").read_bytes()), tuple)


def test_an_add_with_host_ports_is_never_failed_by_a_damaged_index(nsb):
    """Promise 3 (issue 43): ADD is never failed by cni-reaper's own bookkeeping (corrupt index or records);
    the chain's result is passed through.

    Broken: an `.index` whose checksum holds but whose entries cannot be made (state/index.py `_make` raises
    Damaged, a ValueError, once per such entry, popping it) fails an ADD that maps host ports with CNI error
    999 "internal error": verbs/add.py `_record` calls `_cached_unrecorded` -> store.entries() outside any
    guard, and `run` catches only CniError and OSError. The sweep before it (guarded) takes one Damaged; with
    two such entries the second reaches the ADD. Reproduce: two entries of another length in `.index` (resealed:
    the checksum holds), then an ADD with a port mapping. Every time."""
    sb = nsb
    conflist = sb.conflist()
    ips_of(sb.driver("add", unique("alloc-"), sb.container(), ("8081:80/tcp",), conflist))
    _damage_index(sb.state_dir(), 2)
    cid, netns = unique("alloc-"), sb.container()
    added = sb.driver("add", cid, netns, ("8082:80/tcp",), conflist)
    assert added.returncode == 0, added.stdout + added.stderr
    assert sb.reach(netns, "172.26.64.1", 8082, "served") == "served"


def test_an_add_with_host_ports_is_never_failed_by_a_torn_index(xsb):
    """Promise 3 (issue 43): ADD is never failed by cni-reaper's own bookkeeping (a corrupt index); the chain's
    result is passed through.

    Broken: `.index` is written without fsync (state/index.py write_whole: "a lost or stale index is found
    out"); its second part's checksum is checked only when it is read (`_read_cold`), which raises Damaged (a
    ValueError). An ADD that maps host ports reads it first in verbs/add.py `_cached_unrecorded` ->
    store.entries() (the verb's sweep before it reads only the entries not seen live), outside any guard, and
    `run` catches only CniError and OSError: CNI error 999, the allocation fails. Reproduce: one byte of
    `.index` cut off its end (a torn write after a crash, a flipped bit in the second part), then an ADD with
    a port mapping. Every time, the package and the release binary alike."""
    sb = xsb
    conflist = sb.conflist()
    for port in ("8081:80/tcp", "8083:80/tcp"):
        ips_of(sb.driver("add", unique("alloc-"), sb.container(), (port,), conflist))
    index = sb.state_dir() / ".index"
    index.write_bytes(index.read_bytes()[:-1])
    cid, netns = unique("alloc-"), sb.container()
    added = sb.driver("add", cid, netns, ("8082:80/tcp",), conflist)
    assert added.returncode == 0, added.stdout + added.stderr
    assert sb.reach(netns, "172.26.64.1", 8082, "served") == "served"


def _unrecorded_metric(sb, *cli: str) -> float:
    out = sb.cli("metrics", *cli)
    for line in out.stdout.splitlines():
        if line.startswith("cni_reaper_unrecorded_attachments_total"):
            return float(line.split()[-1])
    raise AssertionError(out.stdout + out.stderr)


def test_an_add_unrecorded_for_a_lock_held_past_lock_timeout_is_counted(nsb):
    """Promise 3 (issue 43): an ADD its bookkeeping could not record passes the chain's result through, logs an
    error and counts cni_reaper_unrecorded_attachments_total (docs/reference.md names "the state lock held too
    long" as one of its causes).

    Broken: state/counters.py `unrecorded` counts only when it can take the state lock at once (`wait=0`); the
    ADD went unrecorded precisely because another process holds that lock, so the count is never made (the ADD's
    after-the-answer child gives up at lockTimeout, while the lock is still held). Reproduce: lockTimeout 2, the
    state lock held 6 s by another process, an ADD: the log says "was not recorded", the metric stays 0. Every
    time."""
    import fcntl
    import time

    sb = nsb
    conflist = sb.conflist(lockTimeout=2)
    ips_of(sb.driver("add", unique("alloc-"), sb.container(), (), conflist))
    before = _unrecorded_metric(sb, "--state-dir", str(sb.state_dir()))
    lock = open(sb.state_dir() / ".lock", "a")  # noqa: SIM115 - held across the ADD below
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cid, netns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", cid, netns, (), conflist, settle=False))
        time.sleep(4)  # the child waits lockTimeout (2 s) after the answer, then gives up
    finally:
        lock.close()
    sb.settle()
    assert "was not recorded" in sb.log_file.read_text()
    assert sb.record(cid) is None
    after = _unrecorded_metric(sb, "--state-dir", str(sb.state_dir()))
    assert after == before + 1, f"cni_reaper_unrecorded_attachments_total {before} -> {after}"


def _stopped_holder(sb, path):
    """A process that takes the flock of `path` and stops itself (SIGSTOP): a lock held by a stopped process."""
    import subprocess
    import sys

    code = ("import fcntl, os, signal, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); os.kill(os.getpid(), signal.SIGSTOP)")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def _release(p) -> None:
    import signal

    p.send_signal(signal.SIGKILL)
    p.wait()


def _recreate_forming(sb, conflist, **conf):
    """A recorded allocation whose namespace was removed and made anew at the same path (Nomad's recreate
    after a failed CHECK, before its STATUS and ADD)."""
    import subprocess

    cid, netns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", cid, netns, ("8085:80/tcp",), conflist))
    sb.remove_container(netns)
    name = os.path.basename(netns)
    subprocess.run(["ip", "netns", "add", name], check=True)
    sb.containers.append(name)
    return cid, netns


def test_status_answers_at_once_while_a_stopped_process_holds_the_state_lock(nsb):
    """Promise 2 (issue 43), held: STATUS waits 0.5 s at most for a state lock a stopped process holds."""
    import time

    sb = nsb
    conflist = sb.conflist()
    ips_of(sb.driver("add", unique("alloc-"), sb.container(), (), conflist))
    holder = _stopped_holder(sb, sb.state_dir() / ".lock")
    try:
        started = time.monotonic()
        rc, out, err = sb.status()
        took = time.monotonic() - started
    finally:
        _release(holder)
    assert rc == 0, (out, err)
    assert took < 2.0, f"STATUS took {took:.1f} s"


@pytest.mark.parametrize("mode", ["observe", "clean"])
def test_status_never_waits_lock_timeout_for_a_stopped_holder_when_a_recreate_is_forming(nsb, mode):
    """Promise 2 (issue 43): STATUS never waits on another process's state lock for more than ~0.5 s (an
    operator's `sweep --apply --lock-timeout 60`, a lock held by a stopped process).

    Broken: verbs/status.py `_locked_sweep` waits the whole lockTimeout (10 s by default, up to 300) once
    `_recreate_forming` finds any record whose netns path holds another namespace (read without the lock).
    Nomad 1.9.5+ sends STATUS before every ADD and DEL, so every STATUS on the client stalls lockTimeout while
    the lock stays held, and the sweep it waits for never comes when the holder is stopped. In observe mode
    the wait buys nothing even when the lock is let go: that sweep removes nothing (the recreate's ADD fails
    in host-local all the same). (The CHANGELOG documents the wait "for the STATUS before a recreate's ADD";
    STATUS carries no container ID, so every STATUS of the client waits, not only the recreate's.)
    Reproduce: a recorded allocation, its namespace removed and made anew at the same path; the state lock
    held by a stopped process; STATUS: ~10.5 s. Every time."""
    import time

    sb = nsb
    conflist = sb.conflist(mode=mode)
    _recreate_forming(sb, conflist)
    holder = _stopped_holder(sb, sb.state_dir() / ".lock")
    try:
        started = time.monotonic()
        rc, out, err = sb.status(mode=mode)
        took = time.monotonic() - started
    finally:
        _release(holder)
    assert rc == 0, (out, err)
    assert took < 2.0, f"STATUS ({mode} mode) took {took:.1f} s while a stopped process held the state lock"


def _later(rec):
    rec["schema"] = 4
    rec["fromTheFuture"] = {"x": 1}
    rec["current"]["newEvidence"] = [1, 2, 3]


def _reaper_entry(conflist, added_stdout: str) -> dict:
    data = json.loads(conflist.read_text())
    entry = next(p for p in data["plugins"] if p["type"] == "cni-reaper")
    return {"cniVersion": data["cniVersion"], "name": data["name"], **entry,
            "prevResult": json.loads(added_stdout)[-1]}


def test_a_check_after_a_rollback_keeps_a_later_record_as_it_is(nsb):
    """Promise 6 (issue 43): records of a later schema are kept as they are (state/record.py of_later: "never
    rewritten, cleaned or dropped here"), judged unknown.

    Broken: verbs/check.py `_adopt` finds the later record's life (of_later keeps only its addresses: no
    namespace) not the same as the live one, "repairs" it (merge) and saves a schema 2 record over it: the
    later release's fields are gone. Nomad sends CHECK for every allocation at each client restart, so after a
    rollback (0.6 -> 0.5) every record the later release wrote is rewritten, and a roll-forward finds none of its
    own fields. Reproduce: a live allocation, its record made schema 4 (later than any this release
    reads) with a field of its own, CHECK. Every
    time."""
    sb = nsb
    conflist = sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    added = sb.driver("add", cid, netns, ("8100:80/tcp",), conflist)
    ips_of(added)
    sb.edit_record(cid, _later)
    path = next(p for p in sb.state_dir().glob("r-*.json") if cid in p.read_text())
    text = path.read_text()
    rc, _, err = sb.plugin("CHECK", _reaper_entry(conflist, added.stdout), cid, netns)
    assert rc == 0, err
    assert path.read_text() == text, f"the later record was rewritten by CHECK:\n{path.read_text()[:400]}"


def test_a_del_after_a_rollback_never_mangles_a_later_record(nsb):
    """Promise 6 (issue 43): records of a later schema are kept, never dropped or rewritten here (rollback).

    Broken: verbs/delete.py `_torn_down` saves the record it loaded, which for a later schema is of_later's
    reduction (its lives' addresses and netns path only): the file is rewritten still claiming schema 4, with
    the later release's own fields gone and the evidence of its life (netnsId, host, veth, reservations)
    nulled; a roll-forward reads a record of its own schema that lost what it wrote. Reproduce: a live
    allocation, its record made schema 4 with fields of its own, the runtime's DEL. Every time."""
    sb = nsb
    conflist = sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", cid, netns, ("8100:80/tcp",), conflist))
    sb.edit_record(cid, _later)
    path = next(p for p in sb.state_dir().glob("r-*.json") if cid in p.read_text())
    before = json.loads(path.read_text())
    assert sb.driver("del", cid, netns, ("8100:80/tcp",), conflist).returncode == 0
    if path.exists():
        now = json.loads(path.read_text())
        assert now.get("fromTheFuture") == before["fromTheFuture"], now
        assert now["current"].get("newEvidence") == [1, 2, 3], now
        assert now["current"]["netnsId"] == before["current"]["netnsId"], now


def _pad_journal(path, up_to: int) -> None:
    """Lines the reader skips ("{}": no event), appended until the file is `up_to` bytes."""
    size = path.stat().st_size if path.exists() else 0
    with open(path, "ab") as f:
        f.write(b"{}\n" * ((up_to - size) // 3))
    os.chmod(path, 0o600)


def test_journal_sees_every_removed_item_while_a_sweep_rotates_it(nsb):
    """Promise 1 (issue 43): `cni-reaper journal <cid>` sees every removed item; the journal's generations keep
    them a month.

    Broken: tools/cmd_journal.py reads the generations without the state lock (state/journal.py `read`: from
    `.journal.8` down to `.journal`, one file at a time), and a clean-up that rotates meanwhile
    (`Journal._rotate`: `.journal` becomes `.journal.1`) moves the lines not read yet into a generation
    already read: the reader then reads the new `.journal` and misses every item of the old one. Reproduce: A
    swept (its items in `.journal`), `.journal` padded to just under 32 MiB and `.journal.1` full (its parse
    takes seconds); `journal A` started, then `sweep --apply` of a dead B. Every time (the window is the
    parse of `.journal.1`). `undo A`, which holds the lock, still finds them (held)."""
    import time

    from cni_reaper.state.journal import MAX_BYTES

    sb = nsb
    conflist = sb.conflist()
    a, a_ns = unique("dead-"), sb.container()
    ips_of(sb.driver("add", a, a_ns, ("8120:80/tcp",), conflist))
    sb.remove_container(a_ns)
    assert sb.cli("sweep", "--apply").returncode == 0
    state = sb.state_dir()
    assert any(r["key"][1] == a for r in json.loads(sb.cli("journal", a, "--json").stdout))
    b, b_ns = unique("dead-"), sb.container()
    ips_of(sb.driver("add", b, b_ns, ("8121:80/tcp",), conflist))
    sb.remove_container(b_ns)
    _pad_journal(state / ".journal", MAX_BYTES - 64)
    _pad_journal(state / ".journal.1", MAX_BYTES - 64)
    reader = sb.popen([str(sb.plugin_dir / "cni-reaper"), "journal", a, "--json", "--cni-conf-dir", str(sb.root / "none")])
    time.sleep(1.0)
    swept = sb.cli("sweep", "--apply")
    out, err = reader.communicate(timeout=120)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert (state / ".journal.2").exists(), "the sweep did not rotate the journal"
    undo = sb.cli("undo", a, "--dry-run")
    assert "would put back" in undo.stdout, undo.stdout + undo.stderr  # under the lock: every item
    rows = json.loads(out or "[]")
    assert any(r["key"][1] == a for r in rows), f"`journal {a}` saw nothing of {a} while the journal rotated: {err}"


def test_a_settings_file_reached_through_a_symlink_is_judged_by_the_directory_it_is_in(tmp_path):
    """Promise 5 (issue 43): a settings file that another user could replace (its directory is theirs) is
    refused and never followed, symlinks included.

    Broken: cni/settings_file.py `_read_regular` opens the path following symlinks and judges the directory of
    the path as given (`os.path.dirname(os.path.abspath(path))`), not of the file it opened: the same file in a
    directory owned by uid 1000 is refused when named directly and taken when named through a link from a
    root-owned directory (/etc/cni-reaper/config.json -> /home/ops/cni/config.json); the owner of that
    directory can then swap the file for a link to any root-owned JSON document, which steers root
    (stateDir, mode, logFile). Reproduce: as in the test. Every time."""
    from cni_reaper.cni import settings_file

    etc, ops, other = tmp_path / "etc-cni-reaper", tmp_path / "home-ops", tmp_path / "root-owned"
    for d in (etc, ops, other):
        d.mkdir()
        os.chmod(d, 0o755)
    os.chown(ops, 1000, 1000)
    (ops / "config.json").write_text('{"mode": "observe"}')
    os.chmod(ops / "config.json", 0o644)
    (etc / "config.json").symlink_to(ops / "config.json")
    direct = settings_file.load({"CNI_REAPER_CONFIG": str(ops / "config.json")})
    assert direct.problem and not direct.keys  # its directory is uid 1000's: refused
    # the owner of ops/ swaps the file for a link to a root-owned JSON document of their choosing
    (other / "doc.json").write_text('{"mode": "clean", "stateDir": "/var/lib/elsewhere"}')
    os.chmod(other / "doc.json", 0o644)
    (ops / "config.json").unlink()
    (ops / "config.json").symlink_to(other / "doc.json")
    os.lchown(ops / "config.json", 1000, 1000)
    linked = settings_file.load({"CNI_REAPER_CONFIG": str(etc / "config.json")})
    assert linked.problem and not linked.keys, f"taken through the links: {linked.keys}"


def test_a_del_and_a_status_are_never_failed_by_a_temp_name_that_cannot_be_removed(xsb):
    """Promise 3 (issue 43): DEL is never failed by cni-reaper's own bookkeeping (a record file that is a
    directory, and the like), and STATUS fails only with code 50 for an unusable state directory.

    Broken: whoever takes the state lock removes the temp files of writers that died (state/store.py
    `_load_index` -> SafeDir.sweep_temps -> SafeDir.unlink, which lets every OSError but ENOENT through); a
    `.tmp.*` name that cannot be unlinked (a directory: EISDIR; EPERM, EBUSY alike) raises OSError from
    Store.session. ADD and CHECK catch OSError; verbs/delete.py `_run` catches only CniError and
    verbs/status.py `_locked_sweep` too: the DEL fails the whole chain's DEL and STATUS answers code 999
    ("internal error"), which makes Nomad 1.9.5+ skip the allocation's DEL. Reproduce: `mkdir
    <stateDir>/.tmp.x`, then the runtime's DEL of a live allocation, and STATUS. Every time, the package and the
    release binary alike."""
    sb = xsb
    conflist = sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    ips_of(sb.driver("add", cid, netns, ("8130:80/tcp",), conflist))
    (sb.state_dir() / ".tmp.r-x.json.1").mkdir()
    rc, out, _ = sb.status()
    deleted = sb.driver("del", cid, netns, ("8130:80/tcp",), conflist)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert rc == 0 or (out or {}).get("code") == 50, out


DAMAGE = ("state-dir-a-file", "state-dir-a-symlink", "state-dir-0777", "state-dir-uid-1000", "record-a-directory",
          "record-a-fifo", "record-garbage", "lock-a-directory", "lock-a-fifo", "index-a-directory",
          "index-journal-a-directory", "journal-a-directory", "modes-a-directory", "metrics-a-directory",
          "afterwards-lock-a-fifo")


def _damage(state, kind: str, cid: str) -> None:
    import shutil

    from cni_reaper.state.names import record_name

    own = state / record_name(NET, cid, "eth0")
    named = {"lock": ".lock", "index": ".index", "index-journal": ".index-journal", "journal": ".journal",
             "modes": ".modes", "metrics": ".metrics", "afterwards-lock": ".afterwards.lock", "record": own.name}
    if kind == "state-dir-a-file":
        shutil.rmtree(state)
        state.write_text("x")
    elif kind == "state-dir-a-symlink":
        state.rename(state.with_name("reaper-real"))
        state.symlink_to(state.with_name("reaper-real"))
    elif kind == "state-dir-0777":
        os.chmod(state, 0o777)
    elif kind == "state-dir-uid-1000":
        os.chown(state, 1000, 1000)
    elif kind == "record-garbage":
        own.write_text("garbage")
        os.chmod(own, 0o600)
    else:
        what, _, shape = kind.partition("-a-")
        p = state / named[what]
        if p.exists() and not p.is_dir():
            p.unlink()
        if shape == "directory":
            p.mkdir(exist_ok=True)
        else:
            os.mkfifo(p)


@pytest.mark.parametrize("kind", DAMAGE)
def test_add_check_del_pass_through_whatever_the_state_directory_is(nsb, kind):
    """Promise 3 (issue 43), held: with the state directory (or one of its files) unusable in each of these ways,
    ADD, CHECK and DEL answer as the chain does, each within 2 s; STATUS answers 0 or code 50."""
    import time

    sb = nsb
    conflist = sb.conflist()
    ips_of(sb.driver("add", unique("warm-"), sb.container(), (), conflist))
    cid, netns = unique("alloc-"), sb.container()
    _damage(sb.state_dir(), kind, cid)
    started = time.monotonic()
    added = sb.driver("add", cid, netns, ("8140:80/tcp",), conflist, settle=False)
    assert added.returncode == 0 and time.monotonic() - started < 2, added.stderr
    assert sb.reach(netns, "172.26.64.1", 8140, "served") == "served"
    rc, _, err = sb.plugin("CHECK", _reaper_entry(conflist, added.stdout), cid, netns)
    assert rc == 0, err
    rc, out, err = sb.status()
    assert rc == 0 or (out or {}).get("code") == 50, out
    started = time.monotonic()
    deleted = sb.driver("del", cid, netns, ("8140:80/tcp",), conflist, settle=False)
    assert deleted.returncode == 0 and time.monotonic() - started < 2, deleted.stderr
