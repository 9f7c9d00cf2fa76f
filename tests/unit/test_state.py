"""The attachment record and the state directory, through the verbs that use them."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import threading

import pytest

from cni_reaper.state.store import record_name
from testkit.cni import NETNS, conf, invoke, prev_result

pytestmark = pytest.mark.usefixtures("private_host")  # verbs in process: a throwaway netns and mount ns


def records(state):
    return [json.loads(p.read_text()) for p in sorted(state.glob("r-*.json"))]


def test_add_writes_one_private_record_per_attachment(tmp_path):
    state = tmp_path / "s"
    c = conf(state, runtimeConfig={"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
    assert invoke("ADD", c, cid="alloc-1", CNI_ARGS="IgnoreUnknown=1;NOMAD_ALLOC_ID=alloc-1")[0] == 0
    assert invoke("ADD", c, cid="alloc-2")[0] == 0
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = sorted(state.glob("r-*.json"))
    assert len(files) == 2 and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    rec = json.loads((state / record_name("nomad-reaper", "alloc-1", "eth0")).read_text())
    st = os.stat(NETNS)
    # /proc/self/ns/net is a symlink: its nsfs inode is made anew on each look, so no change time is kept
    assert rec["current"]["netnsId"] == {"dev": st.st_dev, "ino": st.st_ino, "ctime": None}
    assert rec["current"]["ips"] == [{"address": "172.26.64.2", "prefix": 20, "family": 4, "reservation": None}]
    assert rec["current"]["portMappings"][0]["hostPort"] == 8080
    assert rec["cniArgs"] == {"IgnoreUnknown": "1", "NOMAD_ALLOC_ID": "alloc-1"}
    assert rec["pluginVersion"] and rec["current"]["createdAt"]
    assert not [p for p in state.iterdir() if p.name.startswith(".tmp.")]


def test_dual_stack_ips_are_recorded_with_family(tmp_path):
    prev = prev_result()
    prev["ips"].append({"address": "fd00:26::2/64", "interface": 2})
    assert invoke("ADD", conf(tmp_path / "s", prev=prev))[0] == 0
    [rec] = records(tmp_path / "s")
    assert {(i["address"], i["prefix"], i["family"]) for i in rec["current"]["ips"]} == {
        ("172.26.64.2", 20, 4), ("fd00:26::2", 64, 6)}


def test_repeated_add_of_the_same_life_keeps_no_earlier_incarnation(tmp_path):
    c = conf(tmp_path / "s")
    invoke("ADD", c)
    invoke("ADD", c)
    [rec] = records(tmp_path / "s")
    assert rec["earlier"] == []


def _life(address, netns=NETNS):
    from cni_reaper.cni.result import recorded_ips
    from cni_reaper.reap.probes import observe_life
    from cni_reaper.state.record import RecordedIP, life

    ips = [RecordedIP(a.address, a.prefix, a.family) for a in recorded_ips(prev_result(address=address))]
    return life(observe_life(netns, []), ips, [])


def _settings():
    from cni_reaper.state.record import RecordSettings

    return RecordSettings("/i", "/c", "auto")


def test_re_add_with_new_ip_keeps_the_earlier_incarnation():
    from cni_reaper.state.record import merge

    first, _ = merge(None, "n", "x", "eth0", _life("172.26.64.2/20"), {}, _settings())
    second, kept = merge(first, "n", "x", "eth0", _life("172.26.64.9/20"), {}, _settings())
    assert kept and second.current.ips[0].address == "172.26.64.9"
    assert [e.ips[0].address for e in second.earlier] == ["172.26.64.2"]
    same, kept = merge(second, "n", "x", "eth0", _life("172.26.64.9/20"), {}, _settings())
    assert not kept and len(same.earlier) == 1


def test_re_add_after_del_keeps_the_torn_down_life_only_when_it_held_other_addresses():
    from cni_reaper.state.record import merge, tombstone

    first, _ = merge(None, "n", "x", "eth0", _life("172.26.64.2/20"), {}, _settings())
    first = first.replace(deleted=tombstone(True, True, True, verify=True, cached=True))
    again, kept = merge(first, "n", "x", "eth0", _life("172.26.64.3/20"), {}, _settings())
    assert kept and again.deleted is None and len(again.earlier) == 1
    same, kept = merge(first, "n", "x", "eth0", _life("172.26.64.2/20"), {}, _settings())
    assert not kept and same.deleted is None and same.earlier == ()


def test_earlier_incarnations_are_bounded():
    from cni_reaper.state.record import merge

    rec = None
    for i in range(2, 30):
        rec, _ = merge(rec, "n", "x", "eth0", _life(f"172.26.64.{i}/20"), {}, _settings())
    assert rec is not None and len(rec.earlier) == 16 and rec.earlier[-1].ips[0].address == "172.26.64.28"


def test_del_marks_a_tombstone_once(tmp_path):
    state = tmp_path / "s"
    invoke("ADD", conf(state))
    assert invoke("DEL", conf(state, prev=None), netns="/var/run/netns/does-not-exist") == (0, None)
    [rec] = records(state)
    first = rec["deleted"]
    assert first["netnsGone"] is True and first["hadPrevResult"] is False
    assert invoke("DEL", conf(state)) == (0, None)
    assert records(state)[0]["deleted"] == first


@pytest.mark.parametrize("beside", [False, True])
def test_a_del_run_beside_the_plugins_leaves_what_changed_since_to_the_next_sweep(tmp_path, monkeypatch, beside):
    """The wrapper runs a DEL beside the real plugin's only when a look at the record found nothing of the
    attachment to remove first. Should the DEL, judging again under the lock, find something after all (the
    record or the netns changed in between: a case only a fake can make), it removes nothing beside the
    plugins' teardown: its tombstone asks the next sweep for a second look. Run at once, it removes what it
    found and needs no second look."""
    import io

    from cni_reaper.cni import shell
    from cni_reaper.reap import engine
    from cni_reaper.verbs.dispatch import dispatch

    state = tmp_path / "s"
    invoke("ADD", conf(state))
    jobs: list = []

    def handler(inv):
        inv.later = jobs if beside else None
        return dispatch(inv)

    monkeypatch.setattr(engine, "can_wait", lambda state_dir, call: True)
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "alloc-1", "CNI_NETNS": "/var/run/netns/gone-meanwhile",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
    assert shell.run(env, io.BytesIO(json.dumps(conf(state)).encode()), io.StringIO(), handler) == 0
    assert len(jobs) == (1 if beside else 0)
    for job in jobs:
        job()
    [rec] = records(state)
    assert rec["deleted"]["verify"] is beside


def test_del_with_unusable_state_dir_still_succeeds(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    assert invoke("DEL", conf(tmp_path / "link")) == (0, None)
    (tmp_path / "file").write_text("x")
    assert invoke("DEL", conf(tmp_path / "file")) == (0, None)


def test_symlinked_state_dir_is_refused_but_never_fails_an_add(tmp_path):
    """Not followed, and no allocation fails for it: the ADD passes the chain's result through unrecorded (an
    error in the log); STATUS answers, and says in the log that the state directory is unusable."""
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    rc, out = invoke("ADD", conf(tmp_path / "link"))
    assert rc == 0 and out["ips"]
    assert list(target.iterdir()) == []
    assert_status_says(tmp_path, conf(tmp_path / "link", "1.1.0", prev=None), "symlink")


def test_loose_state_dir_mode_is_tightened(tmp_path):
    state = tmp_path / "s"
    state.mkdir(mode=0o755)
    invoke("ADD", conf(state))
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


@pytest.mark.parametrize("damage", ["garbage", "truncated", "symlink", "world-writable", "other-key"])
def test_a_damaged_record_is_quarantined_and_never_crashes_a_verb(tmp_path, damage, capfd):
    state = tmp_path / "s"
    invoke("ADD", conf(state))
    path = state / record_name("nomad-reaper", "alloc-1", "eth0")
    text = path.read_text()
    if damage == "garbage":
        path.write_bytes(b"\x00\xff not json")
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "symlink":
        path.unlink()
        (tmp_path / "elsewhere").write_text(text)
        path.symlink_to(tmp_path / "elsewhere")
    elif damage == "world-writable":
        path.chmod(0o666)
    elif damage == "other-key":
        path.write_text(text.replace('"alloc-1"', '"alloc-2"'))
    for verb in ("DEL", "ADD"):
        assert invoke(verb, conf(state))[0] == 0
    assert list(state.glob("*.corrupt")), "the damaged record was not moved aside"
    assert "quarantined" in capfd.readouterr().err
    [rec] = records(state)  # ADD wrote a fresh one
    assert rec["containerID"] == "alloc-1"


def test_a_lock_held_too_long_never_fails_an_add(tmp_path):
    state = tmp_path / "s"
    invoke("ADD", conf(state))
    fd = os.open(state / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        rc, out = invoke("ADD", conf(state, lockTimeout=0.2), cid="held")
        assert rc == 0 and out["ips"]  # passed through, unrecorded: never a failed allocation for a held lock
        assert invoke("DEL", conf(state, lockTimeout=0.2)) == (0, None)  # DEL never fails the chain
    finally:
        os.close(fd)
    assert invoke("ADD", conf(state, lockTimeout=0.2))[0] == 0


def test_concurrent_adds_are_serialised_and_lose_nothing(tmp_path):
    state = tmp_path / "s"
    results = []

    def one(i):
        results.append(invoke("ADD", conf(state, prev=prev_result(address=f"172.26.65.{i}/20")), cid=f"a{i}")[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0] * 20
    assert sorted(r["containerID"] for r in records(state)) == sorted(f"a{i}" for i in range(20))


def test_temp_debris_of_a_killed_writer_is_removed(tmp_path):
    state = tmp_path / "s"
    invoke("ADD", conf(state))
    (state / ".tmp.r-dead.json.12345").write_text("{")
    invoke("ADD", conf(state))
    assert not list(state.glob(".tmp.*"))


def test_check_adopts_a_missing_record_and_passes(tmp_path):
    state = tmp_path / "s"
    assert invoke("CHECK", conf(state)) == (0, None)
    [rec] = records(state)
    assert rec["current"]["netns"] == NETNS


def test_check_repairs_a_stale_record(tmp_path, capfd):
    state = tmp_path / "s"
    invoke("ADD", conf(state, prev=prev_result(address="172.26.64.7/20")))
    assert invoke("CHECK", conf(state)) == (0, None)
    [rec] = records(state)
    assert rec["current"]["ips"][0]["address"] == "172.26.64.2"
    assert "repaired" in capfd.readouterr().err


def test_check_fails_when_the_netns_is_gone(tmp_path):
    rc, out = invoke("CHECK", conf(tmp_path / "s"), netns="/var/run/netns/nope")
    assert rc == 1 and out["code"] == 3


def test_check_without_prev_result_is_invalid_config(tmp_path):
    rc, out = invoke("CHECK", conf(tmp_path / "s", prev=None))
    assert rc == 1 and out["code"] == 7


def test_status_succeeds_when_add_can_be_served(tmp_path):
    assert invoke("STATUS", conf(tmp_path / "s", "1.1.0", prev=None)) == (0, None)
    assert not (tmp_path / "s").exists(), "STATUS must not create anything"


def assert_status_says(tmp_path, c: dict, problem: str) -> None:
    """STATUS succeeds with an unusable state directory (Nomad refuses every ADD and skips an allocation's
    whole DEL when STATUS fails; the ADD is served unrecorded), and its log line names the problem and fix."""
    log_file = tmp_path / "status.log"
    log_file.unlink(missing_ok=True)
    assert invoke("STATUS", {**c, "logFile": str(log_file)}) == (0, None)
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    said = [ln for ln in lines if ln.get("level") == "error" and problem in ln.get("problem", "")]
    assert said and "stateDir" in said[0]["fix"], lines


def test_status_never_fails_for_the_state_directory_nor_for_a_clean_up(tmp_path, monkeypatch):
    """An unusable state directory: STATUS answers, an error in the log with the reason. No iptables at all:
    STATUS succeeds too (Nomad skips an allocation's whole DEL when STATUS fails; a clean-up that cannot run
    waits instead)."""
    (tmp_path / "file").write_text("")
    assert_status_says(tmp_path, conf(tmp_path / "file", "1.1.0", prev=None), "not a directory")
    (tmp_path / "other").mkdir()
    os.chown(tmp_path / "other", 1234, 1234)
    assert_status_says(tmp_path, conf(tmp_path / "other", "1.1.0", prev=None), "owned by uid 1234")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("cni_reaper.reap.netfilter.flavour.FALLBACK_PATH", str(tmp_path))
    assert invoke("STATUS", conf(tmp_path / "s", "1.1.0", prev=None)) == (0, None)


def test_gc_drops_only_this_networks_attachments_missing_from_the_valid_list(tmp_path):
    state = tmp_path / "s"
    for cid in ("keep", "gone"):
        invoke("ADD", conf(state, "1.1.0"), cid=cid)
    other = conf(state, "1.1.0", name="other-net")
    invoke("ADD", other, cid="gone")
    gc = conf(state, "1.1.0", prev=None, **{"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]})
    assert invoke("GC", gc, cid=None, netns=None, ifname=None) == (0, None)
    assert {(r["network"], r["containerID"]) for r in records(state)} == {("nomad-reaper", "keep"), ("other-net", "gone")}


@pytest.mark.parametrize("valid", ["x", 5, [1], ["a"], [{"containerID": 5, "ifname": "eth0"}],
                                   [{"containerID": "a", "ifname": ["eth0"]}]])
def test_gc_refuses_a_valid_list_it_cannot_read(tmp_path, valid):
    """Skipping an entry it cannot read could remove what that entry protects: nothing is removed."""
    state = tmp_path / "s"
    invoke("ADD", conf(state, "1.1.0"), cid="a")
    gc = conf(state, "1.1.0", prev=None, **{"cni.dev/valid-attachments": valid})
    rc, out = invoke("GC", gc, cid=None, netns=None, ifname=None)
    assert rc == 1 and out["code"] == 7
    assert records(state)[0]["deleted"] is None


@pytest.mark.parametrize("gc_keys,kept", [
    ({}, set()),  # Go's omitempty drops an empty list
    ({"cni.dev/valid-attachments": None}, set()),  # libcni marshals a nil slice as null
    ({"cni.dev/valid-attachments": []}, set()),
    ({"CNI.dev/Valid-Attachments": [{"ContainerID": "a", "IfName": "eth0"}]}, {"a"}),
    ({"cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}]}, {"a"}),  # the spec's earlier name
    ({"cni.dev/valid-attachments": [None, {"containerID": "a"}]}, {"a"}),  # no ifname: any of a's
    ({"cni.dev/valid-attachments": [{"containerID": "../x", "ifname": "eth0"}, {"ifname": "eth0"}]}, set()),
])
def test_gc_reads_the_valid_list_as_go_does(tmp_path, gc_keys, kept):
    state = tmp_path / "s"
    for cid in ("a", "b"):
        invoke("ADD", conf(state, "1.1.0"), cid=cid)
    gc = conf(state, "1.1.0", prev=None, **gc_keys)
    assert invoke("GC", gc, cid=None, netns=None, ifname=None) == (0, None)
    assert {r["containerID"] for r in records(state)} == kept


def test_a_record_owned_by_another_user_is_quarantined(tmp_path, capfd):
    state = tmp_path / "s"
    invoke("ADD", conf(state))
    [path] = state.glob("r-*.json")
    os.chown(path, 65534, 65534)  # nobody
    assert invoke("DEL", conf(state)) == (0, None)
    assert invoke("STATUS", conf(state, "1.1.0", prev=None)) == (0, None)
    assert list(state.glob("*.corrupt")) and "owned by uid 65534" in capfd.readouterr().err


def test_a_state_dir_owned_by_another_user_is_refused_and_no_verb_fails_for_it(tmp_path):
    state = tmp_path / "s"
    state.mkdir(mode=0o700)
    os.chown(state, 65534, 65534)
    rc, out = invoke("ADD", conf(state))
    assert rc == 0 and out["ips"] and list(state.iterdir()) == []  # not followed, and no allocation fails for it
    assert invoke("DEL", conf(state)) == (0, None)
    assert_status_says(tmp_path, conf(state, "1.1.0", prev=None), "owned by uid 65534")


FULL_DISK = r"""
import io, json, sys
from cni_reaper.cni import shell
from cni_reaper.verbs.dispatch import dispatch
state = sys.argv[1]
results = {}
for verb, version in (("ADD", "1.0.0"), ("DEL", "1.0.0"), ("STATUS", "1.1.0")):
    conf = {"cniVersion": version, "name": "n", "stateDir": state, "logFile": "",
            "prevResult": {"cniVersion": version, "ips": [{"address": "10.0.0.2/24"}]}}
    env = {"CNI_COMMAND": verb, "CNI_CONTAINERID": "big", "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0",
           "CNI_PATH": "/x", "CNI_ARGS": "K=" + "v" * 4000}
    out = io.StringIO()
    rc = shell.run(env, io.BytesIO(json.dumps(conf).encode()), out, dispatch)
    results[verb] = [rc, json.loads(out.getvalue()) if out.getvalue() else None]
print(json.dumps(results))
"""


def test_a_full_disk_never_fails_add_del_or_status(tmp_path):
    import subprocess
    import sys

    mnt = tmp_path / "small"
    mnt.mkdir()
    # a 16 KiB tmpfs, mounted in a private mount namespace so that nothing outside the test sees it
    script = (f"mount -t tmpfs -o size=16k none {mnt} && mkdir -m 700 {mnt}/s && "
              f"dd if=/dev/zero of={mnt}/fill bs=1k count=64 2>/dev/null; "
              f'exec "{sys.executable}" -c "$0" {mnt}/s')
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, FULL_DISK],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    rc, out = results["ADD"]
    assert rc == 0 and out["ips"]  # the chain's result passed through, unrecorded (issue 43, item 3)
    assert results["DEL"] == [0, None]
    assert results["STATUS"] == [0, None]


# -- the index: with nothing stale, a verb reads no other attachment's record -----------------------
def index_entries(state) -> dict:
    """The index as a reader sees it: written whole, then the journal's changes (as JSON lists)."""
    from cni_reaper.state.index import decode_all, make

    raw, hosts, dirs = decode_all((state / ".index").read_bytes())
    entries = {n: make(v, hosts, dirs).to_list() for n, v in raw.items()}
    journal = state / ".index-journal"
    for i, line in enumerate(journal.read_text().splitlines() if journal.exists() else []):
        name, entry = json.loads(line)
        if i == 0 and name == "index":  # the journal's head: the index it extends
            continue
        if entry is None:
            entries.pop(name, None)
        else:
            entries[name] = entry
    return entries


def _live_records(state, n):
    for i in range(n):
        assert invoke("ADD", conf(state, prev=prev_result(address=f"172.26.65.{i + 2}/20")), cid=f"live-{i}")[0] == 0


def test_with_nothing_stale_a_verb_reads_only_its_own_record(tmp_path, monkeypatch):
    from cni_reaper.state.store import Store

    state = tmp_path / "s"
    _live_records(state, 30)
    loaded = []
    original = Store.load_named

    def counting(self, name, expect=None):
        loaded.append(name)
        return original(self, name, expect)

    monkeypatch.setattr(Store, "load_named", counting)
    assert invoke("ADD", conf(state), cid="new")[0] == 0
    assert invoke("DEL", conf(state), cid="new")[0] == 0
    assert invoke("STATUS", conf(state, "1.1.0", prev=None), cid=None, netns=None, ifname=None) == (0, None)
    from cni_reaper.state.store import record_name

    assert set(loaded) == {record_name("nomad-reaper", "new", "eth0")}, loaded  # none of the 30 others


@pytest.mark.parametrize("damage", ["missing", "garbage", "stale-inode", "extra-record", "record-gone"])
def test_an_index_that_disagrees_with_the_directory_is_made_anew(tmp_path, damage):
    """The index is a cache: a lost, damaged or stale one is found out by one scan and rebuilt from the
    records, so that a dead attachment is never hidden by it."""
    import os
    import shutil

    state = tmp_path / "s"
    _live_records(state, 3)
    index = state / ".index"
    assert index.exists()
    records = sorted(state.glob("r-*.json"))
    if damage == "missing":
        index.unlink()
    elif damage == "garbage":
        index.write_text("{not json")
    elif damage == "stale-inode":  # a record rewritten by a writer that died before updating the index
        doc = json.loads(records[0].read_text())
        (tmp_path / "netns").mkdir()
        d = os.stat(tmp_path / "netns")
        doc["current"]["netns"] = str(tmp_path / "netns" / "gone-for-good")  # gone from a directory seen as recorded
        doc["current"]["netnsId"] = None
        doc["current"]["netnsDir"] = {"dev": d.st_dev, "ino": d.st_ino}
        tmp = state / "copy"
        tmp.write_text(json.dumps(doc))
        os.chmod(tmp, 0o600)
        os.replace(tmp, records[0])
    elif damage == "extra-record":  # a record saved by a writer that died before updating the index
        shutil.copy(records[0], state / "r-0000.json")
        os.chmod(state / "r-0000.json", 0o600)
    elif damage == "record-gone":
        records[0].unlink()
    rc, _ = invoke("STATUS", conf(state, "1.1.0", prev=None), cid=None, netns=None, ifname=None)
    assert rc == 0
    entries = index_entries(state)
    names = sorted(p.name for p in state.glob("r-*.json"))
    assert sorted(entries) == names
    assert all(entries[n][0] == os.stat(state / n).st_ino for n in names)
    if damage == "stale-inode":
        assert len(names) == 2  # the dead one was seen (through the rebuilt index) and swept


def test_the_index_journal_stays_short_and_a_cut_line_is_found_out(tmp_path):
    """Each ADD appends one line to the journal instead of writing the whole index; past JOURNAL_MAX lines the
    index is written whole. A line cut by a writer that died makes the index be made anew."""
    from cni_reaper.state.index import JOURNAL_MAX

    state = tmp_path / "s"
    _live_records(state, JOURNAL_MAX + 10)
    journal = state / ".index-journal"
    lines = journal.read_text().splitlines() if journal.exists() else []
    assert len(lines) <= JOURNAL_MAX
    with open(journal, "a") as f:
        f.write('["r-cut", [1, "x"')  # no end: the writer died mid-line
    assert invoke("STATUS", conf(state, "1.1.0", prev=None), cid=None, netns=None, ifname=None) == (0, None)
    entries = index_entries(state)
    assert sorted(entries) == sorted(p.name for p in state.glob("r-*.json"))
    assert not journal.exists() or "r-cut" not in journal.read_text()


def test_the_quick_judgement_of_the_index_says_what_the_full_one_says(tmp_path):
    """With nothing stale a verb judges a thousand live entries in one batch, one lstat each (index.quick,
    evidence.live_at_path): for every kind of entry it must give the state the full judgement gives, and it
    must be what judges the plain live ones (else the batch proves nothing)."""
    import subprocess

    from cni_reaper.reap import probes
    from cni_reaper.reap.evidence import LIVE, View
    from cni_reaper.reap.sweep import judge_entry, judge_indexed
    from cni_reaper.state.index import Entry
    from cni_reaper.state.store import Store

    where = tmp_path / "netns"
    where.mkdir()
    pinned = []
    for i in range(3):  # namespaces pinned at paths, as Nomad and iproute2 pin them (in this test's mount namespace)
        p = where / f"ns-{i}"
        p.touch()
        subprocess.run(["unshare", f"--net={p}", "true"], check=True)
        pinned.append(p)
    os.symlink(pinned[0], where / "link")
    try:
        h = probes.host()
        host = (h.boot, h.machine, h.netns, h.mnt)
        d = os.stat(where)
        dir_ = (d.st_dev, d.st_ino, ())

        def ident(p):
            st = os.stat(p)
            return (st.st_dev, st.st_ino, st.st_ctime_ns)

        a, b, c = (ident(p) for p in pinned)
        subprocess.run(["umount", str(pinned[2])], check=True)  # gone: its path holds a plain file now
        cases = {
            "live": dict(netns=str(pinned[0]), ns=a),
            "recycled": dict(netns=str(pinned[1]), ns=(b[0], b[1], b[2] - 1)),  # same inode, made at another time
            "other-inode": dict(netns=str(pinned[1]), ns=(b[0], b[1] + 1, b[2])),
            "gone": dict(netns=str(pinned[2]), ns=c),
            "missing": dict(netns=str(where / "never"), ns=a),
            "symlink": dict(netns=str(where / "link"), ns=a),  # reaches the live one through a symlink
            "proc": dict(netns="/proc/self/ns/net", ns=(h.nsfs, h.netns, None)),
            "another-boot": dict(netns=str(pinned[0]), ns=a, host=("another", h.machine, h.netns, h.mnt)),
            "another-machine": dict(netns=str(pinned[0]), ns=a, host=(h.boot, "another", h.netns, h.mnt)),
            "no-host": dict(netns=str(pinned[0]), ns=a, host=None),
            "earlier": dict(netns=str(pinned[0]), ns=a, earlier=True),
            "tombstone": dict(netns=str(pinned[0]), ns=a, deleted_at=1.0),
            "tombstone-gone": dict(netns=str(pinned[2]), ns=c, deleted_at=1.0, cached=False),
        }
        store = Store(str(tmp_path / "s")).open()
        with store.locked():
            for i, (name, kw) in enumerate(cases.items()):
                e = Entry(i, "net", name, "eth0", kw["netns"], kw["ns"], dir_, kw.get("host", host), None,
                          kw.get("deleted_at"), kw.get("cached"), False, kw.get("earlier", False), [], None)
                assert store.index is not None
                store.index.put(f"r-{name}.json", e)
            view = View()
            entries, quick_states = judge_indexed(store, view, str(tmp_path / "cache"), every=True)
            full = {n: judge_entry(e, View(), str(tmp_path / "cache")) for n, e in entries.items()}
            assert quick_states == full
            assert full["r-live.json"] == LIVE and full["r-gone.json"] != LIVE and full["r-recycled.json"] != LIVE
            # the plain live entry was judged by the batch, and not read in full
            from cni_reaper.reap.evidence import live_at_path

            assert live_at_path(store.quick(), view) == {"r-live.json"}
            assert "r-live.json" not in judge_indexed(store, view, str(tmp_path / "cache"))[0]
            # the same, read back from `.index` as the next call reads it (the flat lists by host), and with one
            # entry changed since in the journal's way: what it is now is judged, not what the file says
            from cni_reaper.state.index import Index

            store.index.write_whole()
            again = Index(store.dir)
            assert again.load({n: e.ino for n, e in entries.items()})
            assert again.quick_view().groups and not again.quick_view().saved
            store.index = again
            assert judge_indexed(store, view, str(tmp_path / "cache"), every=True)[1] == full
            assert live_at_path(store.quick(), view) == {"r-live.json"}
            assert "r-live.json" not in judge_indexed(store, view, str(tmp_path / "cache"))[0]
            e = entries["r-live.json"]
            again.put("r-live.json", Entry(e.ino, e.network, e.cid, e.ifname, e.netns, e.ns, e.dir, e.host, None, 1.0,
                                           True, False, False, [], None))
            assert live_at_path(store.quick(), view) == set()
            assert judge_indexed(store, view, str(tmp_path / "cache"))[1]["r-live.json"] != LIVE
            again.put("r-gone.json", None)
            assert "r-gone.json" not in judge_indexed(store, view, str(tmp_path / "cache"), every=True)[0]
        store.close()
    finally:
        for p in pinned[:2]:
            subprocess.run(["umount", str(p)], check=False)


def _damaged(hot, cold, damage):
    """`.index`'s first part (changed in place) and second part (returned) as `damage` says."""
    group = hot["quick"][0]  # host, start, end, runs, bases, ints, digest
    if damage == "second-part-cut":
        return cold[:len(cold) // 2]
    if damage == "second-part-short":
        return json.dumps(json.loads(cold)[:-1]).encode()
    changes = {
        "ints-not-ints": lambda: group.__setitem__(5, [int(x) for x in group[5].split(",")]),  # as v6 held them
        "digest-off": lambda: group.__setitem__(6, group[6] + 1),  # compared one by one: all live all the same
        "digest-and-ints-off": lambda: group.__setitem__(5, "1," + group[5]) or group.__setitem__(6, group[6] + 1),
        "paths-not-paths": lambda: group.__setitem__(4, [7 for _ in group[4]]),
        "runs-not-runs": lambda: group.__setitem__(3, [[7, "x"] for _ in group[3]]),
        "runs-short": lambda: group[3][-1].__setitem__(1, group[3][-1][1] - 1),  # fewer paths than the group's
        # another directory that exists: nothing there is the namespaces recorded
        "runs-elsewhere": lambda: group.__setitem__(3, [["/", len(group[4])]]),
    }
    if damage in changes:
        changes[damage]()
    return cold


@pytest.mark.parametrize("damage", ["second-part-cut", "second-part-short", "ints-not-ints", "paths-not-paths",
                                    "runs-not-runs", "runs-short", "runs-elsewhere", "first-part-not-json",
                                    "digest-off", "digest-and-ints-off"])
def test_an_index_damaged_behind_its_checksum_fails_no_verb_and_removes_nothing(tmp_path, damage, request):
    """`.index` is trusted as cni-reaper wrote it once its checksum holds (no per-field checks: they cost every
    call). Damaged behind a right checksum all the same (a writer of another build), with its names and inodes
    still agreeing with the directory: no verb fails, nothing live is taken for dead, and the index is made
    anew."""
    import subprocess

    from cni_reaper.state.index import decode, seal, second_part
    from cni_reaper.state.store import Store

    state = tmp_path / "s"
    pinned = []
    for i in range(3):  # namespaces pinned at paths, as Nomad pins them: entries the quick judgement reads
        p = tmp_path / f"ns-{i}"
        p.touch()
        subprocess.run(["unshare", f"--net={p}", "true"], check=True)
        pinned.append(p)
        prev = prev_result(address=f"172.26.65.{i + 2}/20", netns=str(p))
        assert invoke("ADD", conf(state, prev=prev), cid=f"live-{i}", netns=str(p))[0] == 0
    request.addfinalizer(lambda: [subprocess.run(["umount", str(p)], check=False) for p in pinned])
    store = Store(str(state)).open()
    with store.locked():
        assert store.index is not None
        store.index.write_whole()  # as every 64th change does
    store.close()
    data = (state / ".index").read_bytes()
    whole = decode(data)
    assert isinstance(whole, tuple)
    hot, sealed = whole
    cold = json.dumps(second_part(sealed)).encode()
    assert hot["quick"] and len(hot["names"]) == 3, hot  # the flat lists are what is damaged below
    cold = _damaged(hot, cold, damage)
    first = b"{" if damage == "first-part-not-json" else json.dumps(hot).encode()
    (state / ".index").write_bytes(seal(first, cold))
    before = {p.name: p.read_bytes() for p in state.glob("r-*.json")}
    assert invoke("ADD", conf(state, prev=prev_result(address="172.26.66.9/20")), cid="new")[0] == 0
    for _ in range(2):
        assert invoke("STATUS", conf(state, "1.1.0", prev=None), cid=None, netns=None, ifname=None) == (0, None)
    after = {p.name: p.read_bytes() for p in state.glob("r-*.json")}
    assert {n: after.get(n) for n in before} == before and len(after) == 4
    # one of them dies: now the damaged part is read (the quick entries' fields), found out, and made anew
    subprocess.run(["umount", str(pinned[0])], check=True)
    for _ in range(3):
        assert invoke("STATUS", conf(state, "1.1.0", prev=None), cid=None, netns=None, ifname=None) == (0, None)
    left = {p.name: p.read_bytes() for p in state.glob("r-*.json")}
    assert all(left.get(record_name("nomad-reaper", f"live-{i}", "eth0")) == before[record_name("nomad-reaper", f"live-{i}", "eth0")]
               for i in (1, 2))
    assert sorted(index_entries(state)) == sorted(left)


def test_an_index_crafted_to_allocate_gigabytes_is_made_anew_at_once(tmp_path):
    """Five bytes behind the right magic and checksum once made `marshal` reserve 16 GB (a red team's case):
    the index is JSON now, whose parser is linear in what it is given; the verb goes on and the index is
    made anew."""
    import time

    from cni_reaper.state.index import seal

    state = tmp_path / "s"
    _live_records(state, 2)
    crafted = (b"(" + (2**31 - 1).to_bytes(4, "little"), b"[" * 200000, b'{"entries": {}, "hosts": 1}')
    for first, second in [(body, b"[]") for body in crafted] + [(b'{"names": []}', body) for body in crafted]:
        (state / ".index").write_bytes(seal(first, second))
        started = time.monotonic()
        assert invoke("ADD", conf(state), cid="new")[0] == 0
        assert time.monotonic() - started < 10  # a hang detector, not a figure
        assert sorted(index_entries(state)) == sorted(p.name for p in state.glob("r-*.json"))


def test_an_intent_of_batched_items_reads_as_one_of_the_items_themselves(tmp_path):
    """The batches' items are made JSON once (what sizes a batch is what its intent writes): the line reads
    back as the intent of the items would, batch by batch."""
    from cni_reaper.state.journal import BATCH, NAME, Journal, batches
    from cni_reaper.state.store import Store

    items = [{"kind": "record", "key": ["n", f"c{i}", "eth0"], "record": {"x": "é\"\\", "n": i}} for i in range(BATCH + 3)]
    store = Store(str(tmp_path / "s")).open()
    journal = Journal(store)
    slices = batches(items)
    assert [(a, b) for a, b, _ in slices] == [(0, BATCH), (BATCH, BATCH + 3)]
    for a, b, dumped in slices:
        journal.intent("STATUS", items[a:b], dumped)
    journal.intent("STATUS", items[:2])
    lines = [json.loads(line) for line in (tmp_path / "s" / NAME).read_text().splitlines()]
    assert [e["items"] for e in lines] == [items[:BATCH], items[BATCH:], items[:2]]
    assert all(e["t"] == "intent" and e["verb"] == "STATUS" for e in lines)
    store.close()


def test_a_state_dir_writable_by_others_is_refused_never_tightened(tmp_path):
    """Issue 43, item 5: anyone could have put anything in it: never used (nor made 0700), only STATUS says so."""
    state = tmp_path / "s"
    state.mkdir()
    os.chmod(state, 0o777)
    rc, out = invoke("ADD", conf(state))
    assert rc == 0 and out["ips"] and list(state.iterdir()) == []
    assert stat.S_IMODE(state.stat().st_mode) == 0o777
    assert_status_says(tmp_path, conf(state, "1.1.0", prev=None), "writable by its group or others")


def test_the_index_names_every_records_attachment_without_making_an_entry(tmp_path):
    """An ADD that maps host ports asks whether libcni caches an attachment with no record (reap/cache
    .unrecorded): the index gives libcni's name of every record's attachment from its first part and the
    entries changed since (journal lines, removals), as the directory holds them, without making one entry or
    reading its second part (1,000 entries made cost that ADD ~5 ms)."""
    from cni_reaper.state.index import JOURNAL_MAX
    from cni_reaper.state.names import attachment_name
    from cni_reaper.state.store import Store

    state = tmp_path / "s"
    _live_records(state, JOURNAL_MAX + 20)  # the index written whole once, then journal lines
    assert invoke("DEL", conf(state), cid="live-7")[0] == 0  # a tombstone: a changed entry
    with Store.session(str(state), 5) as store:  # removed: one of the first part, one of the journal
        for i in (3, JOURNAL_MAX + 5):
            store.remove("nomad-reaper", f"live-{i}", "eth0")
    assert (state / ".index-journal").exists()
    with Store.session(str(state), 5) as store:
        got = store.attached().names
        assert store.index is not None and store.index._cold is not None, "the second part was read"
        made = set(store.index._made)
        expected = {attachment_name(*store.load_named(n).key) for n in store.names()}
    assert got == expected and len(got) == JOURNAL_MAX + 18
    assert "nomad-reaper-live-3-eth0" not in got and "nomad-reaper-live-7-eth0" in got
    assert len(made) < 25, "entries were made for the answer"


def test_an_adds_look_for_unrecorded_attachments_asks_the_records_only_when_libcni_caches_something(tmp_path):
    from cni_reaper.reap.cache import unrecorded
    from cni_reaper.state.names import Attached

    def never() -> Attached:
        raise AssertionError("the records were asked with nothing cached")

    def recorded(*names: str) -> Attached:
        return Attached(set(names), {"nomad"}, set())

    cache = str(tmp_path / "cache")
    assert unrecorded(str(tmp_path / "none"), never, "nomad") is False  # no cache directory
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    (results / ".tmp-write").write_text("")  # libcni's temporary files are no attachments
    assert unrecorded(cache, never, "nomad") is False
    (results / "nomad-alloc-1-eth0").write_text("{}")
    assert unrecorded(cache, lambda: recorded("nomad-alloc-1-eth0"), "nomad") is False
    assert unrecorded(cache, lambda: recorded("nomad-alloc-2-eth0"), "nomad") is True
    # a name two networks known here could have made (red team rt47): the entry itself says whose it is
    from cni_reaper.state.names import record_name

    own = Attached({"nomad-alloc-1-eth0", "nomad-a-b-eth0"}, {"nomad", "nomad-a"}, {record_name("nomad-a", "b", "eth0")})
    entry = results / "nomad-a-b-eth0"
    entry.write_text(json.dumps({"kind": "cniCacheV1", "networkName": "nomad-a", "containerId": "b", "ifName": "eth0"}))
    assert unrecorded(cache, lambda: own, "nomad") is False  # the record's own entry
    entry.write_text(json.dumps({"kind": "cniCacheV1", "networkName": "nomad", "containerId": "a-b", "ifName": "eth0"}))
    assert unrecorded(cache, lambda: own, "nomad") is True  # nomad's a-b, unrecorded
    entry.write_text("{not json")
    assert unrecorded(cache, lambda: own, "nomad") is True  # cannot tell: the look goes before the answer
    entry.write_text(json.dumps({"kind": "cniCacheV1", "networkName": "nomad-a", "containerId": "b", "ifName": "eth0",
                                 "result": {"interfaces": 1, "ips": 2}}))  # read whatever its shape (red team rt48)
    assert unrecorded(cache, lambda: own, "nomad") is False
