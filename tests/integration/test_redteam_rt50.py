"""Red team rt50: (A) observe mode removes nothing anywhere (the one answer of judge/modes.py and its sources),
(B) a verb is never failed or stalled by cni-reaper's own bookkeeping. Attacked in throwaway namespaces with
real iptables, the reference plugins and go-cni. Tests that FAIL on main are breaks; those whose docstring
says "held" passed."""

from __future__ import annotations

import json
import os
import time

import pytest

from testkit.sandbox import ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns

NET = "nomad-reaper"




def _log(sb) -> list[dict]:
    if not sb.log_file.exists():
        return []
    return [json.loads(line) for line in sb.log_file.read_text().splitlines() if line.startswith("{")]


# -- A1. `.modes` removed as its own warning says ----------------------------------------------------------------
def test_removing_a_damaged_modes_file_as_its_fix_says_lets_another_network_clean_an_observed_one(nsb):
    """BREAK (A: observe mode removes nothing, anywhere). Two conflists share the default state directory:
    `watch` chains cni-reaper with "mode": "observe", nomad-reaper chains it in clean mode. An allocation of
    `watch` dies (netns gone, no DEL): nomad-reaper's calls observe it (`.modes` says watch: observe; held).
    `.modes` is then damaged (a torn write): every call observes everything and logs
    "the modes file cannot be read ...", fix "remove <stateDir>/.modes; each network's next call says its mode
    again". The operator does exactly that. The next call of nomad-reaper (an ADD through go-cni) removes the
    observed network's rules, reservation and record: `watch` is configured observe in its own conflist, no
    call of it came in between, and nothing else in the state directory (the record, the index) keeps its mode.
    Reproduce: the steps above; every time.
    Root cause: a network's mode lives only in `.modes` (state/modes.py remember_mode/network_modes); the
    records hold none (state/record.py RecordSettings: ipamDataDir, cniCacheDir, backend), so judge/modes.py
    mode_of takes an unknown chained network as "never chained" and the finder's clean; and the fix text of
    state/modes.py modes() tells the operator to delete the only copy."""
    sb = nsb
    watch = sb.conflist(name="watch", bridge="cni-watch", subnet="172.29.1.0/24", mode="observe")
    clean = sb.conflist()
    cid, ips = sb.leaked(watch, ("8095:80/tcp",))
    before = sb.residue("watch", cid, ips)
    assert before and sb.record(cid) is not None
    modes = sb.state_dir() / ".modes"
    assert json.loads(modes.read_text()).get("watch") == "observe", modes.read_text()
    # control: an ADD of the clean network observes watch's dead allocation
    assert sb.driver("add", unique("alloc-"), sb.container(), (), clean).returncode == 0
    assert sb.residue("watch", cid, ips) == before
    # a torn .modes: every network observed, and the log says how to fix it
    modes.write_text('{"wat')
    assert sb.driver("add", unique("alloc-"), sb.container(), (), clean).returncode == 0
    assert sb.residue("watch", cid, ips) == before
    fixes = [e.get("fix", "") for e in _log(sb) if "modes file cannot be read" in e.get("msg", "")]
    assert fixes and f"remove {sb.state_dir().as_posix().replace(str(sb.cni_dir), '/var/lib/cni')}/.modes" in fixes[-1], fixes
    modes.unlink()  # the fix, as said
    assert sb.driver("add", unique("alloc-"), sb.container(), (), clean).returncode == 0
    assert sb.residue("watch", cid, ips) == before, "an observed network's dead allocation was cleaned"
    assert sb.record(cid) is not None


# -- A2. another state directory's observed network found by a port's look ---------------------------------
def test_an_add_of_a_clean_network_removes_the_dnat_of_an_observed_network_with_its_own_state_dir(nsb):
    """BREAK (A: observe mode removes nothing, anywhere). `watch` chains cni-reaper with "mode": "observe" and
    a state directory of its own ("stateDir": "/var/lib/cni/reaper-watch", as the shipped
    custom-network.conflist has one); nomad-reaper chains it in clean mode with the default state directory.
    An allocation of `watch` mapping host port 8095 dies (netns gone, no DEL). An ADD on nomad-reaper given
    the same host port looks at who else maps it (engine.port_look): the owner has no record in
    nomad-reaper's state directory, libcni's cache proves it dead, and its network's mode is asked of
    nomad-reaper's state directory, which has never heard of `watch`: "never chained", so the finder's
    clean governs. Its DNAT chain, masquerade chain and jumps are removed, although `watch` is in observe
    mode in its own conflist. Reproduce: the steps above (go-cni, reference plugins 1.1.1); every time.
    Root cause: reap/engine.py port_look -> reap/orphans.py _owners_judged takes `recorded()` of this state
    directory only, and state/modes.py verb_sources knows only this state directory's `.modes`; judge/modes.py
    mode_of then gives an unknown network the finder's mode."""
    sb = nsb
    watch = sb.conflist(name="watch", bridge="cni-watch", subnet="172.29.1.0/24", mode="observe",
                        stateDir="/var/lib/cni/reaper-watch")
    cid, ips = sb.leaked(watch, ("8095:80/tcp",))
    before = sb.residue("watch", cid, ips)
    assert any("DNAT" in line or "CNI-DN-" in line for line in before), before
    out = sb.driver("add", unique("alloc-"), sb.container(), ("8095:80/tcp",), sb.conflist())
    assert out.returncode == 0, out.stdout + out.stderr
    assert sb.residue("watch", cid, ips) == before, "the observed network's leftovers were removed"


# -- B1. host-local's locks of other networks, waited for once per clean-up, before the answer ------------------
def _hold(path):
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@pytest.mark.parametrize("verb", ["add", "del", "status"])
def test_host_locals_locks_of_other_networks_stall_a_verb_past_lock_timeout(nsb, verb):
    """BREAK (B: never stall an ADD, CHECK, DEL or STATUS the reference plugins accept, not for cni-reaper's own
    work). Three conflists chain cni-reaper in one state directory with "lockTimeout": 3: `other` (clean) and
    `watch` (observe) each have a dead allocation (netns gone, no DEL). host-local's lock of each of those two
    networks (/var/lib/cni/networks/<net>/lock) is held by another process (a host-local or a sweep stuck on
    it). A call of nomad-reaper, whose own network's lock is free and whose reference plugins answer at once,
    waits for them before its answer: the sweep's clean-up of the clean network waits lockTimeout for
    `other`'s lock, then the dry-run "clean-up" of the observed network waits lockTimeout again for `watch`'s
    (reap/sweep.py _cleaned: two clean() calls, each reap/cleanup.py _clean_locked -> hostlocal.locked_dirs
    d.lock(lockTimeout)); an ADD with host ports does it once more in its look before the answer. Measured
    here: ADD and DEL through go-cni, and STATUS (documented as answering at once), each past lockTimeout + 2 s.
    Reproduce: the steps above; every time."""
    sb = nsb
    other = sb.conflist(name="other", bridge="cni-other", subnet="172.29.2.0/24", lockTimeout=3)
    watch = sb.conflist(name="watch", bridge="cni-watch", subnet="172.29.3.0/24", lockTimeout=3, mode="observe")
    mine = sb.conflist(lockTimeout=3)
    cid, netns = unique("alloc-"), sb.container()
    if verb != "add":
        assert sb.driver("add", cid, netns, (), mine).returncode == 0
    doomed = [sb.container() for _ in range(2)]
    for conflist, ns in zip((other, watch), doomed):
        assert sb.driver("add", unique("alloc-"), ns, (), conflist).returncode == 0
    for ns in doomed:  # both die only now: no call of theirs swept the other
        sb.remove_container(ns)
    held = [_hold(sb.cni_dir / "networks" / n / "lock") for n in ("other", "watch")]
    try:
        started = time.monotonic()
        if verb == "status":
            rc, out, err = sb.status(lockTimeout=3)
            err = f"{out} {err}"
        else:
            done = sb.driver(verb, cid, netns, (), mine, settle=False)
            rc, err = done.returncode, done.stdout + done.stderr
        took = time.monotonic() - started
    finally:
        for fd in held:
            os.close(fd)
    assert rc == 0, err
    assert took < 3 + 2, f"{verb} took {took:.1f} s (lockTimeout 3 s) while other networks' host-local locks were held"


# -- B2. the state directory's file system: full, out of inodes, read-only ------------------------------------
def _reaper_entry(conflist, added: str) -> dict:
    data = json.loads(conflist.read_text())
    entry = next(p for p in data["plugins"] if p["type"] == "cni-reaper")
    return {"cniVersion": data["cniVersion"], "name": data["name"], **entry, "prevResult": json.loads(added)[-1]}


def _exhaust(fs, how: str) -> None:
    import subprocess

    from testkit.mounts import fill

    if how == "full":
        fill(fs)
    elif how == "inodes":
        n = 0
        while True:
            try:
                (fs / f"i{n}").touch()
            except OSError:
                break
            n += 1
    elif how == "readonly":
        state = fs / "reaper"
        subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(state)], check=True)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["full", "inodes", "readonly"])
def test_every_verb_passes_at_once_whatever_the_state_directorys_file_system_lacks(nsb, tmp_path, how):
    """B: held. ADD, CHECK, DEL and STATUS through the chain on a state directory whose tmpfs is full (size=), out of
    inodes (nr_inodes=), or bind-mounted read-only, with a recorded live allocation, a dead one, and a new
    one: each exits 0 (STATUS: 0, or code 50 for an unusable state directory) within lockTimeout (2 s) + 2 s."""
    import subprocess

    sb = nsb
    fs = tmp_path / "statefs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,nr_inodes=64,mode=0755", "none", str(fs)], check=True)
    try:
        conflist = sb.conflist(stateDir=str(fs / "reaper"), lockTimeout=2)
        live, live_ns = unique("alloc-"), sb.container()
        assert sb.driver("add", live, live_ns, ("8150:80/tcp",), conflist).returncode == 0
        sb.leaked(conflist, ("8151:80/tcp",))
        _exhaust(fs, how)
        times, errors = {}, []
        cid, netns = unique("alloc-"), sb.container()
        started = time.monotonic()
        added = sb.driver("add", cid, netns, ("8152:80/tcp",), conflist, settle=False)
        times["add"] = time.monotonic() - started
        if added.returncode:
            errors.append(f"add: {added.stdout} {added.stderr}")
        else:
            assert sb.reach(netns, "172.26.64.1", 8152, "served") == "served"
            started = time.monotonic()
            rc, out, err = sb.plugin("CHECK", _reaper_entry(conflist, added.stdout), cid, netns)
            times["check"] = time.monotonic() - started
            if rc:
                errors.append(f"check: {out} {err}")
        started = time.monotonic()
        rc, out, err = sb.status(stateDir=str(fs / "reaper"), lockTimeout=2)
        times["status"] = time.monotonic() - started
        if rc and (out or {}).get("code") != 50:
            errors.append(f"status: {out} {err}")
        for who, ns, port in ((cid, netns, "8152:80/tcp"), (live, live_ns, "8150:80/tcp")):
            started = time.monotonic()
            done = sb.driver("del", who, ns, (port,), conflist, settle=False)
            times[f"del {who}"] = time.monotonic() - started
            if done.returncode:
                errors.append(f"del: {done.stdout} {done.stderr}")
    finally:
        if how == "readonly":
            subprocess.run(["umount", "-l", str(fs / "reaper")], check=False)
        subprocess.run(["umount", "-l", str(fs)], check=False)
    assert not errors, errors
    slow = {k: round(v, 1) for k, v in times.items() if v > 2 + 2}
    assert not slow, (slow, sb.log_file.read_text()[-3000:])


# -- B3. the state directory's own files damaged in fresh ways -------------------------------------------------
def _plugin(sb, command: str, conf: dict, cid: str = "", netns: str = "", ifname: str = "eth0"):
    """cni-reaper run as the runtime runs it, not waiting for its work after the answer (sb.plugin waits)."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
           "CNI_PATH": f"{sb.plugin_dir}:{sb.plugins}"}
    proc = sb.run([str(sb.plugin_dir / "cni-reaper")], env=env, input=json.dumps(conf))
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def _verbs_timed(sb, conflist, state_dir, live: tuple[str, str], port: int, lock_timeout: float):
    """A new allocation's ADD (with host port `port`), its CHECK, STATUS, then the DEL of it and of `live`:
    (times per verb, errors). STATUS may answer code 50 (an unusable state directory, as documented)."""
    times, errors = {}, []
    cid, netns = unique("alloc-"), sb.container()
    started = time.monotonic()
    added = sb.driver("add", cid, netns, (f"{port}:80/tcp",), conflist, settle=False)
    times["add"] = time.monotonic() - started
    if added.returncode:
        errors.append(f"add: {added.stdout} {added.stderr}")
    else:
        started = time.monotonic()
        rc, out, err = _plugin(sb, "CHECK", _reaper_entry(conflist, added.stdout), cid, netns)
        times["check"] = time.monotonic() - started
        if rc:
            errors.append(f"check: {out} {err}")
    started = time.monotonic()
    rc, out, err = _plugin(sb, "STATUS", sb.status_conf(stateDir=str(state_dir), lockTimeout=lock_timeout), ifname="")
    times["status"] = time.monotonic() - started
    if rc and (out or {}).get("code") != 50:
        errors.append(f"status: {out} {err}")
    for who, ns, p in ((cid, netns, port), (*live, port - 1)):
        started = time.monotonic()
        done = sb.driver("del", who, ns, (f"{p}:80/tcp",), conflist, settle=False)
        times[f"del {who}"] = time.monotonic() - started
        if done.returncode:
            errors.append(f"del: {done.stdout} {done.stderr}")
    return times, errors


def _index_journal_of_a_million_lines(state) -> None:
    journal = state / ".index-journal"
    lines = journal.read_bytes().splitlines()
    assert len(lines) >= 2, lines
    body = (lines[1] + b"\n") * ((64 << 20) // (len(lines[1]) + 1) - 1)
    journal.write_bytes(lines[0] + b"\n" + body)


def _big(name: str, content: bytes = b"x"):
    def damage(state) -> None:
        (state / name).write_bytes(content * ((64 << 20) // len(content)))
        os.chmod(state / name, 0o600)
    return damage


def _record_cut_mid_utf8(state) -> None:
    for p in state.glob("r-*.json"):
        data = p.read_bytes()
        at = data.find(b"caf\\u00e9")  # cni-reaper writes ASCII; an editor writes the character itself
        if at > 0:
            p.write_bytes(data[:at + 3] + "é".encode()[:1])
            return
    raise AssertionError("no record holds an é")


def _records_nul(state) -> None:
    for p in state.glob("r-*.json"):
        p.write_bytes(p.read_bytes().replace(b'"', b'\0', 3))


DAMAGES = {
    "index-journal-1M-lines": _index_journal_of_a_million_lines,
    "index-64MiB": _big(".index"),
    "index-journal-64MiB": _big(".index-journal", b'["r-x.json", null]\n'),
    "journal-64MiB": _big(".journal", b'{"x": 1}\n'),
    "modes-64MiB": _big(".modes"),
    "observed-64MiB": _big(".observed"),
    "booted-64MiB": _big(".booted"),
    "metrics-64MiB": _big(".metrics"),
    "record-cut-mid-utf8": _record_cut_mid_utf8,
    "records-nul": _records_nul,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_every_verb_passes_at_once_whatever_the_state_directorys_files_hold(nsb, damage):
    """B: held. With a live allocation (CNI_ARGS holding an é) and a dead one recorded, one of the state directory's
    own files damaged by hand (a 64 MiB file of garbage or of valid lines, a record cut in the middle of a
    UTF-8 character, NUL bytes): ADD, CHECK, STATUS and DEL each exit 0 within lockTimeout (2 s) + 2 s."""
    sb = nsb
    conflist = sb.conflist(lockTimeout=2)
    live, live_ns = unique("alloc-"), sb.container()
    assert sb.driver("add", live, live_ns, ("8159:80/tcp",), conflist, args=("IgnoreUnknown=1", "NOTE=café")).returncode == 0
    sb.leaked(conflist, ("8158:80/tcp",))
    DAMAGES[damage](sb.state_dir())
    times, errors = _verbs_timed(sb, conflist, sb.state_dir(), (live, live_ns), 8160, 2)
    assert not errors, errors
    slow = {k: round(v, 1) for k, v in times.items() if v > 2 + 2}
    assert not slow, (slow, sb.log_file.read_text()[-3000:])


# -- A3. a conflist entry that gives its mode twice, in two cases ---------------------------------------------
def test_a_conflist_entry_whose_later_mode_key_says_observe_is_cleaned_through_libcni(nsb):
    """BREAK (A: observe from any source wins; a mode that is not known observes). cni-reaper's conflist entry
    says `"mode": "clean", ..., "Mode": "observe"` (an operator switched to observe by adding a line, in
    another case: keys match in any case, as the README says, and Go's decoder of this file takes the last
    one: observe). The CLI reads the file so (`cni-reaper sweep` without --apply on this conflist dir says the
    network is in observe mode). But libcni hands each plugin its entry re-marshalled from a Go map (InjectConf:
    keys sorted, "Mode" before "mode"), so every CNI call sees "mode": "clean" last and takes clean: the next
    ADD through go-cni removes a dead allocation's rules, reservation and record. The settings file makes a
    key given twice with different values observe (rt47); the conflist entry, which the runtime reorders,
    does not. Reproduce: that entry, an allocation whose netns is removed, another ADD; every time.
    Root cause: cni/conf.py parse -> gojson.pick takes the last of the folded keys in the order received."""
    sb = nsb
    conflist = sb.conflist(**{"mode": "clean", "Mode": "observe"})
    text = conflist.read_text()
    assert text.index('"mode"') < text.index('"Mode"'), text
    cid, ips = sb.leaked(conflist, ("8170:80/tcp",))
    before = sb.residue(NET, cid, ips)
    assert before
    said = sb.run([str(sb.plugin_dir / "cni-reaper"), "sweep", "--cni-conf-dir", str(conflist.parent)])
    assert "observe mode" in said.stdout, said.stdout + said.stderr  # the CLI reads the entry as observe
    assert sb.driver("add", unique("alloc-"), sb.container(), (), conflist).returncode == 0
    assert sb.residue(NET, cid, ips) == before, "the CLI says observe; the runtime's next ADD cleaned it"


# -- B4. STATUS through Nomad 1.9.5+'s runtime with a read-only state directory ----------------------------------
def test_a_read_only_state_directory_fails_statuses_that_make_the_runtime_refuse_add_and_skip_del(tmp_path, package_exe):
    """BREAK (B: never fail an ADD, CHECK, DEL or STATUS the reference plugins accept, not for cni-reaper's own
    bookkeeping). Nomad 1.9.5+ (go-cni 1.1.13) calls Status() before every Setup and Teardown, with the
    reference plugins 1.9 and the shipped 1.1.0 conflist. The state directory is bind-mounted read-only (a
    node image's read-only /var/lib/cni, a systemd ReadOnlyPaths=, a remount after a disk error). cni-reaper's
    ADD, CHECK and DEL are built to go on unrecorded there (as on a full disk, where STATUS answers 0), but its
    STATUS answers code 50 ("state directory ... is not writable": verbs/status.py run -> state/safedir.py
    problem, os.access(W_OK) fails with EROFS). The reference plugins alone answer STATUS 0, so through the
    runtime a new allocation's ADD fails, and an allocation's DEL fails before any plugin runs: Nomad then
    skips the allocation's whole teardown (docs/how-it-works.md), leaking the very rules and reservation the
    reference plugins' DEL would have removed. Reproduce: `mount --bind S S; mount -o remount,ro,bind S` on
    the state directory, then the runtime's ADD and DEL; every time."""
    import subprocess

    from testkit.sandbox import Stack

    with open_sandbox(tmp_path, "nft", package_exe, Stack("1.9", "go-cni-1.1.13")) as sb:
        state = sb.root / "state"  # outside /var/lib/cni, which the sandbox binds without its submounts
        conflist = sb.conflist(stateDir=str(state))
        live, live_ns = unique("alloc-"), sb.container()
        ips = ips_of(sb.driver("add", live, live_ns, ("8180:80/tcp",), conflist))
        assert (state / ".index").exists() or list(state.glob("r-*.json"))
        subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(state)], check=True)
            cid, netns = unique("alloc-"), sb.container()
            added = sb.driver("add", cid, netns, ("8181:80/tcp",), conflist, settle=False)
            deleted = sb.driver("del", live, live_ns, ("8180:80/tcp",), conflist, settle=False)
            left = sb.residue(NET, live, ips)
        finally:
            subprocess.run(["umount", "-l", str(state)], check=False)
        failed = {"add": added.stderr.strip()} if added.returncode else {}
        if deleted.returncode or left:
            failed["del"] = f"{deleted.stderr.strip()}; left: {len(left)} rules/reservations"
        assert not failed, failed


# -- B5. the log file, libcni's cache directory, the afterwards lock -----------------------------------------
@pytest.mark.parametrize("what", ["log-fifo-no-reader", "log-fifo-reader-asleep", "log-on-full-fs", "cache-dir-a-file",
                                  "afterwards-lock-held"])
def test_every_verb_passes_at_once_whatever_its_log_cache_dir_or_afterwards_lock_is(nsb, tmp_path, what):
    """B: held. The log file a FIFO with no reader, or with a reader that never reads; the log on a full
    tmpfs; cniCacheDir a regular file; `.afterwards.lock` held exclusively by another process: ADD, CHECK,
    STATUS and DEL each exit 0 within lockTimeout (2 s) + 2 s."""
    import subprocess

    from testkit.mounts import fill

    sb = nsb
    extra: dict = {"lockTimeout": 2}
    cleanup = []
    if what.startswith("log-fifo"):
        fifo = tmp_path / "log.fifo"
        os.mkfifo(fifo, 0o600)
        extra["logFile"] = str(fifo)
        if what == "log-fifo-reader-asleep":
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            cleanup.append(lambda: os.close(reader))
    elif what == "log-on-full-fs":
        fs = tmp_path / "logfs"
        fs.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "none", str(fs)], check=True)
        cleanup.append(lambda: subprocess.run(["umount", "-l", str(fs)], check=False))
        extra["logFile"] = str(fs / "cni-reaper.log")
    elif what == "cache-dir-a-file":
        (tmp_path / "cachefile").write_text("x")
        extra["cniCacheDir"] = str(tmp_path / "cachefile")
    try:
        conflist = sb.conflist(**extra)
        live, live_ns = unique("alloc-"), sb.container()
        assert sb.driver("add", live, live_ns, ("8189:80/tcp",), conflist).returncode == 0
        sb.leaked(conflist, ("8188:80/tcp",))
        if what == "log-on-full-fs":
            fill(fs)
        if what == "afterwards-lock-held":
            fd = _hold(sb.state_dir() / ".afterwards.lock")
            cleanup.append(lambda: os.close(fd))
        times, errors = _verbs_timed(sb, conflist, sb.state_dir(), (live, live_ns), 8190, 2)
    finally:
        for c in cleanup:
            c()
    assert not errors, errors
    slow = {k: round(v, 1) for k, v in times.items() if v > 2 + 2}
    assert not slow, slow
