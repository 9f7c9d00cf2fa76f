"""The index's bookkeeping held to a model: random saves (every kind of entry), removals journaled and batched,
the index written whole and read back as the next call reads it, files re-made at their paths; after each
step what the quick judgement says, what the entries hold and the inodes must be the model's. Regular files
stand in for pinned namespaces (holding_flat compares lstat's dev, inode and ctime only), so no root and no
namespace is needed. (From a red team of index v6.) CNI_REAPER_INDEX_SEEDS and _STEPS make it longer."""

from __future__ import annotations

import os
import random

import pytest

from cni_reaper.reap import evidence
from cni_reaper.state.index import Entry, Index, quick_of
from cni_reaper.state.safedir import SafeDir


class FakeHost:
    def __init__(self, boot, machine):
        self.boot, self.machine, self.nsfs, self.netns, self.mnt, self.problem = boot, machine, 1, 1, 1, ""


class FakeView:
    def __init__(self, host):
        self.host = host


HOSTS = [("boot-a", "m1", 1, 2), ("boot-a", "m1", 1, 3), ("boot-b", "m1", 1, 2), ("boot-a", "", 4, 2), None]


def _entry(rnd, tmp, files, ino):
    path, source = rnd.choice(files)
    st = os.lstat(source)
    ns_kind = rnd.random()
    if ns_kind < 0.6:
        ns = (st.st_dev, st.st_ino, st.st_ctime_ns)
    elif ns_kind < 0.75:
        ns = (st.st_dev, st.st_ino, st.st_ctime_ns + 1)  # recreated: same inode, another ctime
    elif ns_kind < 0.85:
        ns = (st.st_dev, st.st_ino, None)
    else:
        ns = None
    host = rnd.choice(HOSTS)
    deleted = rnd.choice([None, None, None, 12.5])
    return Entry(ino, "net", f"c{rnd.randrange(1000)}", "eth0", str(path), ns,
                 (1, 2, (rnd.randrange(3),)) if rnd.random() < 0.7 else None, host,
                 ("veth1", 3) if rnd.random() < 0.5 else None, deleted, True if deleted else None,
                 bool(deleted) and rnd.random() < 0.5, rnd.random() < 0.15, [f"10.0.0.{rnd.randrange(9)}"],
                 "/c" if rnd.random() < 0.5 else None, rnd.choice([False] * 8 + [True, 1796114877.25]))


def _expected_live(model, view):
    h = view.host
    out = set()
    for n, e in model.items():
        q = quick_of(e)
        if q is None:
            continue
        host, (path, ns) = q
        if host[0] == h.boot and (not host[1] or not h.machine or host[1] == h.machine):
            if not path.startswith("/"):  # relative to nothing the judgement knows: judged in full
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino, st.st_ctime_ns) == tuple(ns):
                out.add(n)
    return out


class Run:
    """The index under test, the model it must agree with, and the removals batched and not flushed yet."""

    def __init__(self, tmp_path, rnd):
        self.rnd, self.tmp = rnd, tmp_path
        # (the path recorded, the file whose identity is recorded): paths of every shape a runtime could
        # hand in, each looked at relative to its directory by the quick judgement and with lstat by the model
        self.files = []
        (tmp_path / "d2").mkdir()
        for i in range(6):
            p = tmp_path / f"ns-{i}"
            p.write_text("x")
            self.files.append((str(p), str(p)))
        for i in range(2):
            p = tmp_path / "d2" / f"ns-{i}"
            p.write_text("x")
            self.files.append((str(p), str(p)))
        (tmp_path / "via").symlink_to(tmp_path / "d2")  # a symlinked directory (as /var/run is to /run)
        (tmp_path / "last").symlink_to(tmp_path / "ns-0")  # a last component that is a symlink: not followed
        self.files += [(str(tmp_path / "via" / "ns-0"), str(tmp_path / "d2" / "ns-0")),
                       (str(tmp_path / "d2" / ".." / "ns-1"), str(tmp_path / "ns-1")),
                       (str(tmp_path / "last"), str(tmp_path / "ns-0")),
                       (str(tmp_path / "last"), str(tmp_path / "last")),
                       (str(tmp_path / "ns-2") + "/", str(tmp_path / "ns-2")),
                       (str(tmp_path / "gone" / "ns-0"), str(tmp_path / "ns-0")),
                       (str(tmp_path / "ns-3") + "/.", str(tmp_path / "ns-3")),
                       (str(tmp_path / "d2"), str(tmp_path / "d2")),
                       ("ns-4", str(tmp_path / "ns-4"))]
        self.sd = SafeDir(str(tmp_path / "s")).open()
        self.idx = Index(self.sd)
        self.idx.write_whole()
        self.model: dict[str, Entry] = {}
        self.ino = 100
        self.pending: set[str] = set()

    def flush(self):
        self.idx.flush()
        self.pending.clear()

    def save(self, n):
        self.ino += 1
        e = _entry(self.rnd, self.tmp, self.files, self.ino)
        if n in self.pending:  # as the sweeps do: removals batched, flushed before anything else of that name
            self.flush()
        self.idx.set(n, e)
        self.model[n] = e

    def remove(self, n):
        if n in self.idx.inos:
            batch = self.rnd.random() < 0.7
            self.idx.set(n, None, write=not batch)
            if batch:
                self.pending.add(n)
            self.model.pop(n, None)

    def reread(self):  # a new call: reads `.index` and its journal back
        self.flush()
        again = Index(self.sd)
        assert again.load({n: e.ino for n, e in self.model.items()})
        self.idx = again

    def step(self):
        op, rnd = self.rnd.random(), self.rnd
        n = f"r-{rnd.randrange(12):02d}.json"
        if op < 0.45:
            self.save(n)
        elif op < 0.6:
            self.remove(n)
        elif op < 0.65:
            self.flush()
        elif op < 0.72:
            self.flush()
            self.idx.write_whole()
        elif op < 0.85:
            self.reread()
        elif op < 0.9:  # a file at a path re-made (a netns re-created: its ctime changes)
            p = rnd.choice(self.files)[1]
            os.utime(p)
            searchable = 0o100 if os.path.isdir(p) else 0  # a directory stays searchable (root passes anyway)
            os.chmod(p, (0o600 if rnd.random() < 0.5 else 0o644) | searchable)

    def check(self, view):
        """What a sweep reads, against the model."""
        live = evidence.live_at_path(self.idx.quick_view(), view)
        assert live == _expected_live(self.model, view)
        if self.rnd.random() < 0.5:
            got = self.idx.entries_but(live) if live else self.idx.entries
            assert set(got) == set(self.model) - live
            for n, e in got.items():
                assert e.to_list() == self.model[n].to_list(), n
        assert self.idx.inos == {n: e.ino for n, e in self.model.items()}


@pytest.mark.parametrize("seed", range(int(os.environ.get("CNI_REAPER_INDEX_SEEDS", "60"))))
def test_the_index_says_what_a_model_of_it_says(tmp_path, seed):
    rnd = random.Random(seed)
    run = Run(tmp_path, rnd)
    views = [FakeView(FakeHost("boot-a", "m1")), FakeView(FakeHost("boot-a", "")), FakeView(FakeHost("boot-b", "m2"))]
    for step in range(int(os.environ.get("CNI_REAPER_INDEX_STEPS", "120"))):
        run.step()
        try:
            run.check(rnd.choice(views))
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, step {step}: {exc}") from None
    run.sd.close()


def test_a_journal_line_with_any_field_of_the_wrong_shape_is_no_entry():
    """The index's fields are declared once (index.FIELDS): a journal line is an entry when each field has its
    shape, and none when any one has another (a bool for an int, a string for a list, a list too short)."""
    from cni_reaper.state.index import FIELDS, Entry

    good = [7, "net", "c", "eth0", "/run/netns/x", [1, 2, 3], [4, 5, [6]], ["b", "m", 8, 9], ["veth0", 3], 1.5, True,
            False, False, ["10.0.0.2"], "/var/lib/cni", 12.0]
    e = Entry.of_list(good)
    assert e is not None and e.to_list() == good and Entry.of_list(e.to_list()).to_list() == good
    wrong = {"ino": True, "network": 1, "cid": None, "ifname": 2, "netns": [], "ns": [1, 2], "dir": [4, 5, ["x"]],
             "host": ["b", "m", 8, "9"], "veth": ["veth0"], "deleted_at": "1", "cached": 1, "verify": None,
             "earlier": 0, "ips": [1], "cache_dir": 5, "left": float("nan")}
    assert set(wrong) == {f[0] for f in FIELDS}
    for i, f in enumerate(FIELDS):
        line = list(good)
        line[i] = wrong[f[0]]
        assert Entry.of_list(line) is None, f[0]
    assert Entry.of_list(good[:-1]) is None and Entry.of_list(tuple(good)) is None


def test_the_index_names_its_entries_fields_and_an_index_of_other_fields_is_made_anew(tmp_path):
    """Issue 44: the index stores named fields: its first part says, by name and in order, what each position of
    an entry holds (FIELDS); an index whose names are not this release's (a field added, removed or moved by
    another release) is not read as this release's entries: the next call makes it anew from the records."""
    import json

    from cni_reaper.state import index as index_module
    from cni_reaper.state.index import FIELDS, INDEX_NAME, decode, seal

    run = Run(tmp_path, random.Random(7))
    for i in range(8):
        run.save(f"r-{i:02d}.json")
    run.flush()
    run.idx.write_whole()
    data = (tmp_path / "s" / INDEX_NAME).read_bytes()
    whole = decode(data)
    assert isinstance(whole, tuple)
    hot, cold = whole
    assert hot["fields"] == [f[0] for f in FIELDS]
    assert all(len(v) == len(FIELDS) for v in hot["raw"])
    run.reread()  # read back as written
    found = {n: e.ino for n, e in run.model.items()}
    for names in (hot["fields"][::-1], [*hot["fields"], "written_by"], hot["fields"][:-1], None):
        other = dict(hot, fields=names) if names is not None else {k: v for k, v in hot.items() if k != "fields"}
        (tmp_path / "s" / INDEX_NAME).write_bytes(seal(json.dumps(other).encode(), cold[4:]))
        assert decode((tmp_path / "s" / INDEX_NAME).read_bytes()) is None, names
        again = Index(run.sd)
        assert not again.load(found), names  # not this release's: made anew (Store.entries rebuilds it)
    # a release whose FIELDS differ reads this one's index as another's
    index_module.NAMED = [*index_module.NAMED, "written_by"]
    try:
        run.idx.write_whole()
    finally:
        index_module.NAMED = [f[0] for f in FIELDS]
    assert decode((tmp_path / "s" / INDEX_NAME).read_bytes()) is None
    run.sd.close()


def test_the_index_entrys_checks_are_its_models():
    """Issue 44: an index entry is declared once, by models.IndexEntry; state/index.py's FIELDS (each field's check,
    reading and writing) are generated from it (scripts/generate.py): a journal line is an entry exactly when the
    model takes its fields, on a valid entry and on each field made wrong in every way the other test makes it."""
    import json

    from cni_reaper.models import IndexEntry
    from cni_reaper.state.index import FIELDS, Entry

    names = [f[0] for f in FIELDS]
    assert names == list(IndexEntry.model_fields)
    good = [7, "net", "c", "eth0", "/run/netns/x", [1, 2, None], [4, 5, [6, 7]], ["b", "m", 8, 9], ["veth0", 3], 2,
            None, True, False, [], None, True]
    wrong = [True, 1.5, None, [], {}, [1, 2], [1, 2, 3, 4], ["b", "m", 8, "9"], ["veth0"], "1", 1, 0, [1],
             [4, 5, ["x"]], -1.0, 2.0 ** 41, 1e300, "x", [None], [1, "2", 3]]
    for i in range(len(FIELDS)):
        for w in [good[i], *wrong]:
            line = list(good)
            line[i] = w
            doc = json.dumps(dict(zip(names, line)), allow_nan=False)
            try:
                IndexEntry.model_validate_json(doc)
                model = True
            except ValueError:
                model = False
            assert (Entry.of_list(line) is not None) == model, (names[i], w)
