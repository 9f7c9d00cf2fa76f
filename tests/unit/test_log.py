"""The log's lines: a sweep's thousand lines written together read exactly as the same lines written one by one."""

from __future__ import annotations

import json

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


def test_a_line_that_cannot_be_written_fails_nothing(tmp_path):
    log.begin(str(tmp_path / "no-such-dir" / "x.log"), stderr=False)
    log.each("info", "removed", [{"a": 1}])
    log.info("removed", a=1)
