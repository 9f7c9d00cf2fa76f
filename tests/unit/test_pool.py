"""pool.each: the sweeps' record and reservation removals side by side, with real threads and real files."""

from __future__ import annotations

import _thread
import os

import pytest

from cni_reaper.state import pool
from cni_reaper.state.safedir import SafeDir


def test_results_in_order_from_two_threads():
    seen: dict[int, int] = {}

    def fn(x):
        seen[x] = _thread.get_ident()
        return x * x

    items = list(range(100))
    assert pool.each(fn, items) == [x * x for x in items]
    assert len(set(seen.values())) == 2 and set(seen) == set(items)
    assert len({seen[x] for x in range(5)}) == 2  # alternating: both halves started at once


def test_few_items_stay_in_this_thread():
    here = _thread.get_ident()
    assert pool.each(lambda x: _thread.get_ident(), list(range(pool.SMALL - 1))) == [here] * (pool.SMALL - 1)
    assert pool.each(lambda x: x, []) == []


def test_a_failure_is_raised_once_every_item_was_tried():
    tried = []

    def fn(x):
        tried.append(x)
        if x in (7, 30):
            raise OSError(x, "no")
        return x

    with pytest.raises(OSError) as caught:
        pool.each(fn, list(range(40)))
    assert caught.value.errno == 7 and sorted(tried) == list(range(40))


def test_without_threads_one_half_after_the_other(monkeypatch):
    """The one branch a real machine does not take here: no thread can be started (a fake start)."""
    def refuse(*a):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_thread, "start_new_thread", refuse)
    assert pool.each(lambda x: x + 1, list(range(50))) == list(range(1, 51))


def test_files_removed_side_by_side_are_all_gone_and_errors_come_back(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    names = [f"r-{i:04d}.json" for i in range(500)]
    for n in names:
        (d / n).write_text("x")
    (d / "sub").mkdir()
    (d / "sub" / "keep").write_text("x")
    sd = SafeDir(str(d)).open()
    errors = pool.each(sd.unlink_or_error, [*names, "missing", "sub"])
    sd.close()
    assert errors[:-1] == [None] * 501 and isinstance(errors[-1], OSError)
    assert sorted(os.listdir(d)) == ["sub"]


class _OutOfTime(BaseException):
    """As wrap mode's time budget: raised in the calling thread by a signal handler."""


def test_an_interruption_in_the_caller_leaves_no_call_running_after_each(tmp_path):
    """From a red team: the budget's alarm (or ^C) in the calling thread while a batch runs. When each() is
    over (it raises), nothing of it unlinks on: the caller's locks are let go right after."""
    import _signal
    import time

    d = tmp_path / "d"
    d.mkdir()
    names = [f"r-{i:04d}" for i in range(200)]
    for n in names:
        (d / n).write_text("x")
    sd = SafeDir(str(d)).open()
    over = []
    after: list[str] = []

    def slow(name):
        time.sleep(0.005)
        if over:
            after.append(name)
        return sd.unlink_or_error(name)

    def alarm(signum, frame):
        raise _OutOfTime()

    previous = _signal.signal(_signal.SIGALRM, alarm)
    try:
        _signal.setitimer(_signal.ITIMER_REAL, 0.1)
        with pytest.raises(_OutOfTime):
            pool.each(slow, names)
        over.append(True)
        left = len(os.listdir(d))
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, previous)
    time.sleep(0.3)
    sd.close()
    assert after == [] and len(os.listdir(d)) == left and 0 < left < len(names)
