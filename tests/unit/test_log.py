"""The log's lines: a sweep's thousand lines written together read exactly as the same lines written one by one."""

from __future__ import annotations

import json

import pytest

from cni_reaper import log


def test_lines_written_together_are_the_lines_written_one_by_one(tmp_path, capsys):
    rows = [{"network": "nomad", "containerID": f"alloc-{i}", "items": [f"item {i}"], "odd": {i}} for i in range(3)]
    log.begin(str(tmp_path / "one.log"), stderr=True, verb="STATUS")
    for r in rows:
        log.info("removed", **r)
    log.begin(str(tmp_path / "all.log"), stderr=True, verb="STATUS")
    log.each("info", "removed", rows)
    log.each("info", "removed", [])  # nothing: no line
    one, together = (tmp_path / "one.log").read_text(), (tmp_path / "all.log").read_text()
    assert one.splitlines() and [json.loads(x) | {"time": ""} for x in one.splitlines()] == \
        [json.loads(x) | {"time": ""} for x in together.splitlines()]
    got = json.loads(together.splitlines()[2])
    assert got["msg"] == "removed" and got["verb"] == "STATUS" and got["containerID"] == "alloc-2" and got["odd"] == "{2}"
    assert capsys.readouterr().err.count("\n") == 6  # stderr too


def test_a_line_that_cannot_be_written_fails_nothing(tmp_path, capsys):
    """A log file in a directory that does not exist: the lines are dropped, quietly (stdout belongs to the
    protocol, stderr to the runtime), and no directory is made for them."""
    log.begin(str(tmp_path / "no-such-dir" / "x.log"), stderr=False)
    assert log.each("info", "removed", [{"a": 1}]) is None
    assert log.info("removed", a=1) is None
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "no-such-dir").exists()
    log.begin(str(tmp_path / "x.log"), stderr=False)  # and the next call's log, where it can be written, works
    log.info("removed", a=2)
    assert json.loads((tmp_path / "x.log").read_text())["a"] == 2


def test_the_records_dropped_are_told_even_when_a_later_one_cannot_be_trimmed(tmp_path):
    """A sweep's batch drops two records, then a trim fails (a full disk): the two drops are in the log."""
    from cni_reaper.judge import DEAD, LIVE
    from cni_reaper.reap import sweep
    from cni_reaper.values import Key
    from testkit.records import bare

    class Judged:
        def __init__(self, cid, state):
            self.key, self.state, self.why, self.record = Key("nomad", cid, "eth0"), state, "its netns is gone", bare(cid=cid)

    class Store:
        def as_read(self, record):
            return record.doc()

        def remove_all(self, keys):
            return [OSError(13, "Permission denied") if k[1] == "x" else None for k in keys]

        def save(self, record):
            raise OSError(28, "No space left on device")

    class Journal:
        def intent(self, *args):
            return "event"

        def done(self, *args):
            pass

    log.begin(str(tmp_path / "x.log"), stderr=False, verb="STATUS")
    due = [(Judged("a", DEAD), []), (Judged("b", DEAD), []), (Judged("c", LIVE), [])]
    try:
        sweep._settle_all(Store(), due, Journal())
    except OSError:
        pass
    lines = [json.loads(x) for x in (tmp_path / "x.log").read_text().splitlines()]
    assert [(x["msg"], x["containerID"]) for x in lines] == [("record dropped", "a"), ("record dropped", "b")]
    # one of a batch that cannot be removed: the others are told, and the failure is raised
    (tmp_path / "x.log").unlink()
    with pytest.raises(OSError):
        sweep._settle_all(Store(), [(Judged("a", DEAD), []), (Judged("x", DEAD), []), (Judged("b", DEAD), [])], Journal())
    lines = [json.loads(x) for x in (tmp_path / "x.log").read_text().splitlines()]
    assert [(x["msg"], x["containerID"]) for x in lines] == [("record dropped", "a"), ("record dropped", "b")]
