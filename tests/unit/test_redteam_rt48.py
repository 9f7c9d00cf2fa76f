"""Red team rt48 (in-process): record schema 3 (3476481, d200990), the index entry model (48ea5cf) and the
settings file's duplicate keys (88f5848)."""

from __future__ import annotations

import json
import os

import pytest

from testkit.cni import conf, invoke, prev_result
from testkit.releases import plugin_tree
from testkit.settings import read_three_ways

# -- the settings file (cni/settings_file.py, 88f5848) ----------------------------------------------------
_plain_and_doctor = read_three_ways


@pytest.mark.parametrize("text", [
    '{"mode": "observe", "mode": null}',
    '{"networks": {"nomad": {"mode": "observe", "mode": null}}}',
    '{"mode": "observe", "networks": {"nomad": {"mode": "observe", "mode": null}}, "mode": null}',
])
def test_a_later_null_of_the_same_key_drops_the_files_observe_and_doctor_says_ok(tmp_path, text):
    """BREAK (observe mode removes nothing; the settings file's observe must win). The settings file
    {"mode": "observe", "mode": null} (or the same inside networks.nomad): cni/settings_file._object takes a
    null of a field Go does not reset for "nothing given" (Go's struct decoding leaves mode "observe", and so
    does the duplicate check: no key given twice), but then returns dict(pairs), where the later null has
    replaced "observe" under the same key; gojson.pick skips the null, mode is absent, and the wrapped network
    "nomad" is CLEANED (conf.mode_of's default) while `cni-reaper doctor` says OK "every key is usable".
    A key given twice with a null after it, in any case, is the same key given twice: Go keeps "observe",
    cni-reaper must too (or observe, as for any other duplicate). Root cause: settings_file.py _object
    (`return dict(pairs)` after `continue` on a null), read by load() -> _take -> pick."""
    s, modes, finding = _plain_and_doctor(tmp_path, text)
    assert modes.of("nomad") == "observe", (text, s.keys, s.networks, s.problem, finding)


@pytest.mark.parametrize("text", [
    '{"//": "cni-reaper settings for the Nomad bridge", "//": "observe until the log looks right", "mode": "clean"}',
    '{"mode": "clean", "networks": {"nomad": {"_comment": "ours", "_comment": "since 2026-11", "mode": "clean"}}}',
    '{"mode": "clean", "meta": {"owner": "ops", "owner": "platform"}}',
])
def test_a_repeated_comment_key_that_go_ignores_makes_every_network_observe_and_doctor_fail(tmp_path, text):
    """BREAK, false positive (the operator's "clean" taken away by a key cni-reaper does not read). The
    repeated "//" or "_comment" key is the usual way to comment a JSON file, and Go's decoder ignores keys
    that match no field (gojson.py: "ignores keys that match no field"); yet settings_file._object notes every
    key of every object given twice with different values, fields or not (`field or k`), so the whole file is
    unusable: every wrapped network observes (nothing is ever cleaned) and doctor FAILs. Only keys that name
    a field (FILE_FIELDS at the top, OWN_FIELDS in a network, a network's name in networks) can be meant one
    way or the other. Root cause: cni/settings_file.py _object (the loop over `{k, field or k}`)."""
    s, modes, finding = _plain_and_doctor(tmp_path, text)
    assert not s.problem and modes.of("nomad") == "clean" and finding.status != "FAIL", (text, s.problem, finding)


# -- record schema 3 (3476481, d200990) ------------------------------------------------------------------
NET = "nomad-reaper"


def _next_release_record(tmp_path, monkeypatch, cid="n", netns=None, **extra):
    """A record the next release writes (WRITTEN = 3, simulated): its document."""
    from cni_reaper.state import record
    from cni_reaper.state.store import record_name

    state = tmp_path / "s"
    monkeypatch.setattr(record, "WRITTEN", 3)
    assert invoke("ADD", conf(state, **extra), cid=cid, **({"netns": netns} if netns else {}))[0] == 0
    monkeypatch.setattr(record, "WRITTEN", 2)
    path = state / record_name(NET, cid, "eth0")
    return path, json.loads(path.read_text())


@pytest.mark.usefixtures("private_host")
def test_a_writtenby_past_its_models_limit_is_a_record_to_the_reader_and_none_to_the_model(tmp_path, monkeypatch):
    """BREAK (a field is declared once, in its model; record.problem() says what models.Record says). models.Record
    declares writtenBy: Optional[str] = Field(max_length=MAX_TEXT), but the generated check is `v is None or
    type(v) is str`: scripts/generate.py Emitter._union calls self.value(a, v, [], depth) for each option of
    the Optional, dropping the field's metadata (max_length), so state/record_checks.py _Record's writtenBy
    check has no length. A schema 3 record with a writtenBy of 4097 to ~8 MiB characters is taken by every verb
    (and its journal copy by undo) while the published schema (docs/schemas/record.schema.json, models) refuses
    it. Root cause: scripts/generate.py _union (metadata not passed), giving record_checks.py's writtenBy line."""
    from cni_reaper import models
    from cni_reaper.state import record

    _path, doc = _next_release_record(tmp_path, monkeypatch)
    long = dict(doc, writtenBy="0.6.0" + "x" * 5000)
    assert (record.problem(long) is None) == (models.record_problem(long) is None), \
        (record.problem(long), models.record_problem(long))


@pytest.mark.usefixtures("private_host")
def test_a_later_schemas_record_whose_del_finished_is_dropped_from_the_index_alone(tmp_path):
    """BREAK (rollback: "a record of a later schema is kept as it is, never rewritten, cleaned or dropped
    here", state/record.py of_later, store._kept_as_later). A release that writes schema 4 and keeps this index
    (the same IndexEntry fields: nothing in the index says a record's schema) finished a DEL: its record holds a
    tombstone (verify false) whose libcni cache entry is gone, and the index entry says so. After a rollback to
    this release, the first verb of any attachment (an ADD of another container) runs sweep.stale(), which
    judges the index entry DONE and calls store.remove() for it without reading the file: Store._later is
    empty (only load_named fills it), so _kept_as_later says no and the schema 4 record is unlinked.
    Simulated: this release's DEL, then the file rewritten in place as schema 4 (same inode, as the later
    release's index entry would name its own). Root cause: reap/sweep.py sweep_quietly (`for k in done:
    store.remove(...)`) and state/store.py remove/_kept_as_later (a record never read is not known as later);
    index.Entry has no schema (Entry.of_record marks only records *read* as later, left=True)."""
    from cni_reaper.state.store import record_name

    state = tmp_path / "s"
    ns = str(tmp_path / "gone")
    assert invoke("ADD", conf(state, prev=prev_result(netns=ns)), cid="x", netns=ns)[0] == 0
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True, exist_ok=True)
    entry = results / f"{NET}-x-eth0"  # libcni caches it while the chain's DEL runs, and drops it after
    entry.write_text(json.dumps({"kind": "cniCacheV1", "containerId": "x", "ifName": "eth0", "networkName": NET,
                                 "result": prev_result(netns=ns)}))
    assert invoke("DEL", conf(state, prev=prev_result(netns=ns)), cid="x", netns=ns)[0] == 0
    entry.unlink()
    path = state / record_name(NET, "x", "eth0")
    doc = json.loads(path.read_text())
    assert doc["deleted"] is not None and doc["deleted"]["verify"] is False
    doc.update(schema=4, writtenBy="0.7.0", addedIn4={"x": 1})
    with open(path, "r+") as f:  # the later release's record, under the entry its index holds
        f.truncate(0)
        f.write(json.dumps(doc))
    # fixed: the index names the latest record schema its writer reads; the later release's says 4, so this
    # one makes the index anew from the records, and a record read as a later schema's is kept as it is
    from cni_reaper import jsonio
    from cni_reaper.state import index
    from cni_reaper.state.store import Store

    with Store.session(str(state), 5) as store:  # the index whole (the tombstone's entry in it), no journal
        assert store.index is not None
        store.index.write_whole()
    assert not (state / index.JOURNAL_NAME).exists()
    hot, cold = index.decode((state / index.INDEX_NAME).read_bytes())
    (state / index.INDEX_NAME).write_bytes(index.seal(jsonio.dumps(dict(hot, recordSchema=4)).encode(), cold[4:]))
    assert invoke("ADD", conf(state, prev=prev_result(address="172.26.64.9/20")), cid="y")[0] == 0
    assert path.exists(), "the later release's schema 4 record was dropped without being read"
    assert json.loads(path.read_text()) == doc


def _cli(argv):
    import contextlib
    import io

    from cni_reaper.tools import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


_READ_040 = r"""
import json, sys
from cni_reaper.state.record import problem
from cni_reaper.state.store import Store
s = Store(sys.argv[1]).open()
with s.locked():
    names = s.names()
    read = sum(s.load_named(n) is not None for n in names)
journaled = []
for line in open(sys.argv[1] + "/.journal"):
    e = json.loads(line)
    journaled += [problem(i["record"]) for i in e.get("items", []) if i.get("kind") == "record"]
print(json.dumps({"names": len(names), "read": read, "journaled": journaled}))
"""


def _as_040_reads(tmp_path, state):
    import subprocess
    import sys

    tree = plugin_tree(tmp_path)
    out = subprocess.run([sys.executable, "-c", _READ_040, str(state)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=tree))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.usefixtures("private_host")
def test_held_a_next_releases_record_swept_journaled_and_undone_here_is_what_0_4_0_reads(tmp_path, monkeypatch):
    """HELD. The next release's schema 3 record (writtenBy) of a dead attachment: `sweep --apply` here drops it
    (GC's sweep, the runtime's word: its journal copy is schema 2, without writtenBy), `undo` puts it back (schema 2), and 0.4.0's own code
    (git 104b18b) reads the record and takes every journaled record copy; nothing is moved aside."""
    path, doc = _next_release_record(tmp_path, monkeypatch, cid="dead", cniVersion="1.1.0")
    assert doc["schema"] == 3 and doc["writtenBy"]
    state = tmp_path / "s"
    confdir = tmp_path / "net.d"
    confdir.mkdir()
    entry = {k: v for k, v in conf(state).items() if k in ("type", "stateDir", "cniCacheDir", "ipamDataDir")}
    (confdir / "nomad.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": NET, "plugins": [
        {"type": "bridge", "bridge": "nomad", "ipam": {"type": "host-local"}}, entry]}))
    args = ["--state-dir", str(state), "--cni-cache-dir", str(tmp_path / "cache"), "--ipam-data-dir",
            str(tmp_path / "ipam"), "--cni-conf-dir", str(confdir), "--log-file", ""]
    gc = conf(state, "1.1.0", prev=None, **{"cni.dev/valid-attachments": []})  # the runtime's word: gone
    assert invoke("GC", gc, cid=None, netns=None, ifname=None) == (0, None)
    assert not path.exists()
    journal = [json.loads(x) for x in (state / ".journal").read_text().splitlines()]
    copies = [i["record"] for e in journal for i in e.get("items", []) if i.get("kind") == "record"]
    assert copies and all(c["schema"] == 2 and "writtenBy" not in c for c in copies), copies
    rc, out, err = _cli(["undo", *args, "dead", "--json"])
    assert rc == 0 and path.exists(), (out, err)
    back = json.loads(path.read_text())
    assert back["schema"] == 2 and "writtenBy" not in back
    assert _as_040_reads(tmp_path, state) == {"names": 1, "read": 1, "journaled": [None] * len(copies)}
    assert not list(state.glob("*.corrupt*"))
