"""A leftover held by something not ours (a foreign jump to a dead chain): the record's mark, and what the
judgement makes of it. Pure: no root, no namespace."""

from __future__ import annotations

import pytest

from cni_reaper.judge import DEAD, HELD, LEFT, LIVE, UNKNOWN, WAIT
from cni_reaper.judge.life import Sign, decide_record
from cni_reaper.reap.evidence import RecordObserved
from cni_reaper.state import record


class _View:
    def __init__(self, at_once: bool = False) -> None:
        self.at_once = at_once


class _Life:
    blind, other_machine, rebooted = None, False, False

    def __init__(self, path: str | None) -> None:
        self.path, self.veth = Sign(path, "path"), Sign(None, "veth")


class _Deleted:
    done, over = False, False


@pytest.mark.parametrize(("path", "left", "tombstoned", "at_once", "now", "want"), [
    (DEAD, False, False, False, 0.0, DEAD),  # no mark: the evidence stands
    (DEAD, True, False, False, 0.0, LEFT),  # left for the runtime's DEL or GC
    (DEAD, True, True, False, 0.0, WAIT),  # ... which a tombstone has taken over
    (LIVE, True, False, False, 0.0, LIVE),  # alive wins over a left mark
    (DEAD, 100.0, False, False, 99.0, HELD),  # held, before its time
    (DEAD, 100.0, True, False, 99.0, HELD),  # torn down and held
    (DEAD, 100.0, False, False, 100.0, DEAD),  # its time has come: judged again as any dead one
    (DEAD, 100.0, False, True, 0.0, DEAD),  # an operator's sweep, GC: at once
    (LIVE, 100.0, False, False, 0.0, HELD),  # held: not looked at before its time (it protects all the same)
    (None, 100.0, False, False, 100.0, UNKNOWN),  # what cannot be judged stays so
])
def test_what_a_mark_makes_of_a_judgement(path, left, tombstoned, at_once, now, want):
    f = RecordObserved.__new__(RecordObserved)
    f.life, f.word, f.far, f.deleted = _Life(path), None, None, _Deleted() if tombstoned else None
    f.held_due = None if isinstance(left, bool) else not (not at_once and now < left)
    f.left = "left" if left is True else None
    f.mark_why, f.unjudged = "held", None
    assert decide_record(f).state == want


def test_the_wait_doubles_up_to_an_hour_and_every_mark_reads_back():
    mark = None
    waits = []
    for tries in range(1, 10):
        mark = record.held("ipv4 nat CNI-1: still referenced by 1 rule(s) we do not own", mark)
        assert mark.tries == tries and mark.retry_at is not None
        waits.append(record.parse_time(mark.retry_at) - record.parse_time(mark.at))
        assert mark.mark == record.parse_time(mark.retry_at)
        assert record.Left.of(mark.doc()) == mark  # read back as written
    assert [round(w) for w in waits] == [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]
    # a mark left for the runtime does not count as a try
    assert record.held("x", record.left("y")).tries == 1
    assert record.left("y").mark is True
