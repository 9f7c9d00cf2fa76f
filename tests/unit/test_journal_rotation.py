"""The journal is kept a month (README, "Undo"): past its size a generation moves up, up to GENERATIONS of
them; a generation older than a month goes when the journal is read; a line a writer left cut short stays a
line of its own. Pure file work in a tmp dir (no root)."""

from __future__ import annotations

import os
import time

from cni_reaper.state import journal
from cni_reaper.state.store import Store


def _store(tmp_path):
    return Store(str(tmp_path / "state"), 1).open()


def test_rotation_keeps_younger_generations_and_drops_those_past_a_month(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "MAX_BYTES", 400)
    store = _store(tmp_path)
    try:
        j = journal.Journal(store)
        ids = [j.intent("sweep", [{"kind": "conntrack", "key": ["n", f"c{i}", "eth0"], "ip": "10.0.0.1"}])
               for i in range(40)]
        names = sorted(os.listdir(tmp_path / "state"))
        assert journal.generation(journal.GENERATIONS) in names  # every generation in use
        kept = {e["id"] for e in journal.read(store)}
        assert ids[-1] in kept and len(kept) < len(ids)  # bounded: the oldest went with the last generation
        old = tmp_path / "state" / journal.generation(3)
        month_ago = time.time() - journal.MAX_AGE - 60
        os.utime(old, (month_ago, month_ago))
        before = {e["id"] for e in journal.read(store)}
        assert not old.exists() and ids[-1] in before  # a generation past a month goes; the rest stays
    finally:
        store.close()


def test_a_line_cut_short_stays_a_line_of_its_own(tmp_path):
    store = _store(tmp_path)
    try:
        j = journal.Journal(store)
        first = j.intent("sweep", [{"kind": "conntrack", "key": ["n", "a", "eth0"], "ip": "10.0.0.1"}])
        with open(tmp_path / "state" / journal.NAME, "ab") as f:
            f.write(b'{"t": "intent", "id": "cut')  # a writer died here
        second = j.intent("sweep", [{"kind": "conntrack", "key": ["n", "b", "eth0"], "ip": "10.0.0.2"}])
        assert [e["id"] for e in journal.read(store)] == [first, second]
    finally:
        store.close()
