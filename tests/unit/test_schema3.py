"""Issue 44: a field added to the record for real, the first half (expand). Schema 3 adds `writtenBy`, the release
that last wrote a record. This release reads schema 3 and writes schema 2 (state/record.py WRITTEN): a record
the next release writes (schema 3) is read, judged and cleaned here like any other, so that a rollback from it to
this one keeps every record; records this one writes stay what 0.4.x reads (rollback to it: test_release.py)."""

from __future__ import annotations

import json
import os

import pytest

from cni_reaper import __version__, models
from cni_reaper.state import record
from cni_reaper.state.store import record_name
from testkit.cni import conf, invoke, prev_result
from testkit.releases import plugin_tree

pytestmark = pytest.mark.usefixtures("private_host")  # verbs in process: a throwaway netns and mount ns

NET = "nomad-reaper"


def _status(state):
    return invoke("STATUS", conf(state, "1.1.0", prev=None), cid=None, netns=None, ifname=None)


def test_the_next_releases_records_are_schema_3_and_say_who_wrote_them(tmp_path, monkeypatch):
    """What the release after this one writes (WRITTEN = 3, simulated): every key of schema 3, `writtenBy` its
    version, valid by models.Record; and this release's own records are schema 2, as 0.4.x reads them."""
    state = tmp_path / "s"
    assert invoke("ADD", conf(state), cid="now")[0] == 0
    now = json.loads((state / record_name(NET, "now", "eth0")).read_text())
    assert now["schema"] == record.WRITTEN == 2 and "writtenBy" not in now
    models.RecordV2.model_validate_json(json.dumps(now))
    monkeypatch.setattr(record, "WRITTEN", 3)
    assert invoke("ADD", conf(state, prev=prev_result(address="172.26.64.3/20")), cid="next")[0] == 0
    nxt = json.loads((state / record_name(NET, "next", "eth0")).read_text())
    assert nxt["schema"] == 3 and nxt["writtenBy"] == __version__
    models.Record.model_validate_json(json.dumps(nxt))
    assert record.problem(nxt) is None and models.record_problem(nxt) is None
    assert record.problem(dict(nxt, writtenBy=7)) is not None and models.record_problem(dict(nxt, writtenBy=7))
    bare = {k: v for k, v in nxt.items() if k != "writtenBy"}
    assert record.problem(bare) is not None and models.record_problem(bare) is not None  # required in schema 3


def test_a_schema_3_record_is_read_and_written_back_as_schema_2(tmp_path, monkeypatch):
    """A rollback from the next release: its record is no later schema here (not kept aside, not judged
    unknown); a verb that changes it (the runtime's DEL: a tombstone) writes it in the schema written."""
    state = tmp_path / "s"
    monkeypatch.setattr(record, "WRITTEN", 3)
    assert invoke("ADD", conf(state), cid="a")[0] == 0
    monkeypatch.setattr(record, "WRITTEN", 2)
    path = state / record_name(NET, "a", "eth0")
    assert json.loads(path.read_text())["schema"] == 3
    assert invoke("CHECK", conf(state), cid="a")[0] == 0  # read as a live attachment's record
    assert json.loads(path.read_text())["schema"] == 3  # nothing to change: left as it is
    assert invoke("DEL", conf(state), cid="a")[0] == 0
    doc = json.loads(path.read_text())
    assert doc["schema"] == 2 and "writtenBy" not in doc and doc["deleted"] is not None
    assert not list(state.glob("*.corrupt*"))


@pytest.mark.parametrize("schema, kept", [(2, False), (3, False), (4, True)])
def test_a_dead_attachments_schema_3_record_is_judged_and_dropped_a_later_schemas_kept(tmp_path, schema, kept):
    """A record of schema 3 is judged as any record: GC without it in the valid list (the runtime's word that
    it is gone) drops it as it drops one of schema 2; one of schema 4, a schema this release does not read, is
    kept as it is (judged unknown: rollback)."""
    state = tmp_path / "s"
    assert invoke("ADD", conf(state, "1.1.0"), cid="dead")[0] == 0
    path = state / record_name(NET, "dead", "eth0")
    doc = json.loads(path.read_text())
    doc.update(schema=schema, **({"writtenBy": "0.6.0"} if schema > 2 else {}))
    path.write_text(json.dumps(doc))
    os.chmod(path, 0o600)
    (state / ".index").unlink()  # written by hand: the index is made anew from the records
    gc = conf(state, "1.1.0", prev=None, **{"cni.dev/valid-attachments": []})
    assert invoke("GC", gc, cid=None, netns=None, ifname=None) == (0, None)
    assert path.exists() is kept and not list(state.glob("*.corrupt*"))
    if kept:
        assert json.loads(path.read_text()) == doc


_READ_040 = r"""
import json, os, sys
from cni_reaper.state.store import Store
s = Store(sys.argv[1]).open()
with s.locked():
    names = s.names()
    read = [s.load_named(n) for n in names]
    for r in read:
        s.save(r)  # written back in 0.4.0's own way
print(json.dumps({"names": len(names), "read": sum(r is not None for r in read)}))
"""


def test_records_this_release_writes_are_read_by_0_4_0_and_back(tmp_path):
    """Rollback to 0.4.0 and forward again: every record this release writes (live, tombstoned, re-added with an
    earlier life, with ports) is read by 0.4.0's own code (none moved aside as a schema or a key it does not
    know), which writes them back; this release reads what 0.4.0 wrote. 0.4.0's code comes from git (the
    release's commit), so the suite holds it on any clone with history."""
    import subprocess
    import sys

    tree = plugin_tree(tmp_path)
    state = tmp_path / "s"
    ports = {"runtimeConfig": {"portMappings": [{"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp"}]}}
    assert invoke("ADD", conf(state, **ports), cid="live")[0] == 0
    assert invoke("ADD", conf(state, prev=prev_result(address="172.26.64.3/20")), cid="deleted")[0] == 0
    assert invoke("DEL", conf(state, prev=prev_result(address="172.26.64.3/20")), cid="deleted")[0] == 0
    assert invoke("ADD", conf(state, prev=prev_result(address="172.26.64.4/20")), cid="readded")[0] == 0
    assert invoke("ADD", conf(state, prev=prev_result(address="172.26.64.5/20")), cid="readded")[0] == 0
    written = sorted(p.name for p in state.glob("r-*.json"))
    assert len(written) == 3 and all(json.loads((state / n).read_text())["schema"] == 2 for n in written)
    out = subprocess.run([sys.executable, "-c", _READ_040, str(state)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=tree))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"names": 3, "read": 3}, out.stderr
    assert sorted(p.name for p in state.glob("r-*.json")) == written and not list(state.glob("*.corrupt*"))
    for n in written:  # and forward again: what 0.4.0 wrote, this release reads
        assert record.problem(json.loads((state / n).read_text())) is None
    assert invoke("CHECK", conf(state, **ports), cid="live")[0] == 0
    assert _status(state)[0] == 0
    assert not list(state.glob("*.corrupt*"))
