"""Red-team of index v7: the join+count record-name check, and the quick groups' digest."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_reaper.reap import probes
from cni_reaper.state.index import digest, split_paths
from cni_reaper.state.names import all_record_names, is_record_name, others_in

_PIECES = st.sampled_from(["r-", ".json", "\n", "r", "-", ".", "json", "x", ".lock", ".index", "\r", "é", ""])
_NAME = st.lists(_PIECES, max_size=6).map("".join)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(st.lists(_NAME, max_size=6))
def test_all_record_names_is_every_is_record_name_without_newlines(names):
    """HELD: the C trick says exactly what the per-name test says (names with a newline refused)."""
    want = all(is_record_name(n) and "\n" not in n for n in names)
    assert all_record_names(names) == want


def test_lock_and_index_are_others_whatever_the_index_holds():
    found = {".lock": 1, ".index": 2, ".index-journal": 3, "r-a.json": 4, "r-b.json": 5}
    assert sorted(others_in(found, {"r-a.json": 4})) == [".index", ".index-journal", ".lock"]
    assert sorted(others_in(found)) == [".index", ".index-journal", ".lock"]


def test_a_dead_path_is_never_live_by_digest(tmp_path):
    """HELD: a recorded triple (what cni-reaper writes: ints) never has the digest of an unseen path."""
    gone = str(tmp_path / "gone")
    st_ = os.lstat(tmp_path)
    for ints in ([st_.st_dev, st_.st_ino, st_.st_ctime_ns], [0, 0, 0], [-1, -1, -1]):
        assert probes.holding_group(["r-a.json"], *split_paths([gone]), ",".join(map(str, ints)), digest(ints)) == []


def test_damaged_digest_falls_back_to_the_triples(tmp_path):
    st_ = os.lstat(tmp_path)
    ints = [st_.st_dev, st_.st_ino, st_.st_ctime_ns]
    text = ",".join(map(str, ints))
    assert probes.holding_group(["r-a.json"], *split_paths([str(tmp_path)]), text, digest(ints) ^ 1) == ["r-a.json"]
    assert probes.holding_group(["r-a.json"], *split_paths([str(tmp_path)]), text + "1", digest(ints) ^ 1) == []


def test_constructed_digest_collision_is_crafted_only(tmp_path):
    """DOCUMENTED (crafted index only): Python's int hash is modulo 2**61-1, so a recorded ctime of
    ctime + (2**61-1) has the digest of the real one and the group is live by digest although its triples
    differ. lstat never gives such values before ~2043 (ctime_ns < 2**61-1), nor negative ones (hash(-1) ==
    hash(-2)); only someone who can write the root-only `.index` could, and they could write anything."""
    st_ = os.lstat(tmp_path)
    real = [st_.st_dev, st_.st_ino, st_.st_ctime_ns]
    forged = [real[0], real[1], real[2] + (2**61 - 1)]
    assert forged != real and digest(forged) == digest(real)
    assert probes.holding_group(["r-a.json"], *split_paths([str(tmp_path)]), ",".join(map(str, forged)), digest(forged)) == ["r-a.json"]
    assert hash(-1) == hash(-2)
