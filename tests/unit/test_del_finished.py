"""A DEL decides whether its own clean-up finished on the clean-up's values, never on its messages (issue 32,
case 6): what was left of the DEL's attachment, by whichever part of the clean-up and in whatever words, keeps
the tombstone's second look; what was left of another container's does not."""

from __future__ import annotations

from cni_reaper.reap.outcome import Outcome
from cni_reaper.reap.teardown import _finished
from cni_reaper.state.record import Record
from cni_reaper.values import Key
from testkit.records import bare

KEY = Key("nomad", "alloc-1", "eth0")


def record() -> Record:
    return bare(*KEY)


def test_something_left_of_the_attachment_is_not_finished_whatever_the_words():
    for what, why in (("10.0.0.2", "held by x"), ("", "its chains stay, another life of it is there"),
                      ("fd00::2", "reservation not verified gone (reworded)")):
        out = Outcome()
        out.spare(KEY[0], KEY[1], what, why)
        out.skipped = ["a message in other words entirely"]  # the text says nothing the DEL reads
        assert not _finished(record(), out, [])


def test_what_was_left_of_another_container_or_network_does_not_count():
    out = Outcome()
    out.spare(KEY[0], "alloc-10", "10.0.0.3", "held by y")  # a container ID that starts with ours
    out.spare("other", KEY[1], "", "its chains stay")
    assert _finished(record(), out, [])
    out.spare(KEY[0], KEY[1], "", "its chains stay")
    assert not _finished(record(), out, [])


def test_merged_outcomes_keep_what_was_left():
    a, b = Outcome(), Outcome()
    b.spare(KEY[0], KEY[1], "10.0.0.2", "why")
    a.merge(b)
    assert a.spared_of(KEY) and not _finished(record(), a, [])
