"""Red team rt46: the index's named fields (index 9) and the --json documents' generated core schemas.

Breaks FAIL on main; tests marked "held" in their docstring pass (what was tried and held).
No root, no namespace: a state directory under tmp_path, records saved through the Store; "another release's
layout" is this one with FIELDS permuted (as a release that moved a field would write), patched in process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import subprocess
import sys

import pytest

from cni_reaper.state import index as ix
from cni_reaper.state import record as rec
from cni_reaper.state.index import INDEX_NAME, JOURNAL_NAME, Entry
from cni_reaper.state.safedir import SafeDir
from cni_reaper.state.store import Store
from testkit.releases import plugin_tree


# -- helpers ------------------------------------------------------------------------------------------------
def _record(i: int, tomb: bool = False, verify: bool = True) -> rec.Record:
    observed = {"netnsId": {"dev": 4, "ino": 4026532000 + i, "ctime": 1},
                "netnsDir": {"dev": 1, "ino": 2, "groups": [1]},
                "host": {"boot": "b", "machine": "m", "netns": 1, "mnt": 1},
                "veth": {"name": f"veth{i:08x}", "ifindex": 9}}
    life = rec.life(rec.Life.of(dict(observed, netns=f"/var/run/netns/rt46-{i}", ips=[], portMappings=[], createdAt="")),
                    [rec.RecordedIP(f"10.9.0.{i + 2}", 24, 4, rec.ReservationId("/d", 1, 3, 4, 5))], [])
    r, _ = rec.merge(None, "net", f"cid-{i}", f"eth{i}", life, {}, rec.RecordSettings("/d", "/c", "auto"))
    if tomb:
        r = r.replace(deleted=rec.tombstone(True, True, True, verify, cached=False))
    return r


def _entries_from_records(root: str) -> dict[str, list]:
    """What the records say (the index made anew from them, as a fresh directory's first call does)."""
    from cni_reaper.state.names import record_name

    s = Store(root).open()
    try:
        found = s.dir.scan()
        return {record_name(*r.key): Entry.of_record(r, found[record_name(*r.key)]).to_list() for r in s.records()}
    finally:
        s.close()


def _entries_as_read(root: str) -> dict[str, list]:
    """What a call of this release reads (the index on disk and its journal)."""
    s = Store(root).open()
    try:
        with s.locked():
            return {n: e.to_list() for n, e in s.entries().items()}
    finally:
        s.close()


def _keys_as_read(root: str) -> dict[str, tuple]:
    """The key (network, container ID, ifname) of each entry a call of this release reads."""
    return {n: (v[ix.AT["network"]], v[ix.AT["cid"]], v[ix.AT["ifname"]]) for n, v in _entries_as_read(root).items()}


def _keys_of_records(root: str) -> dict[str, tuple]:
    from cni_reaper.state.names import record_name

    s = Store(root).open()
    try:
        return {record_name(*r.key): tuple(r.key) for r in s.records()}
    finally:
        s.close()


@contextlib.contextmanager
def other_layout(mp: pytest.MonkeyPatch, swap: tuple[str, str]):
    """index.py as another release that moved a field would be: FIELDS with two same-typed fields swapped (the
    Entry class of that release takes its arguments in its own order: _values reorders them for this one's)."""
    this = ix.FIELDS
    a, b = (next(i for i, f in enumerate(this) if f[0] == n) for n in swap)
    swapped = list(this)
    swapped[a], swapped[b] = swapped[b], swapped[a]
    fields = tuple(swapped)
    at = {f[0]: i for i, f in enumerate(fields)}
    loads = tuple((i, f[2]) for i, f in enumerate(fields) if f[2] is not None)
    this_order = [f[0] for f in this]

    def values(v):
        for i, load in loads:
            if v[i] is not None:
                v[i] = load(v[i])
        return [v[at[n]] for n in this_order]

    with mp.context() as m:
        m.setattr(ix, "FIELDS", fields)
        m.setattr(ix, "AT", at)
        m.setattr(ix, "_CHECKS", tuple(f[1] for f in fields))
        m.setattr(ix, "_LOADS", loads)
        m.setattr(ix, "_DUMPS", tuple((i, f[3]) for i, f in enumerate(fields) if f[3] is not None))
        m.setattr(ix, "_ATTRS", tuple(f[0] for f in fields))
        m.setattr(ix, "NAMED", [f[0] for f in fields])
        for name in ("netns", "ns", "dir", "host", "deleted_at", "earlier"):
            m.setattr(ix, name.upper(), at[name])
        m.setattr(ix, "_values", values)
        yield


def _call(root: str, *records: rec.Record) -> None:
    """One call: the lock, the index loaded (made anew when it is not this layout's), records saved."""
    s = Store(root).open()
    try:
        with s.locked():
            s.entries()
            for r in records:
                s.save(r)
    finally:
        s.close()


# -- 1. the index's named fields ---------------------------------------------------------------------------
@pytest.mark.parametrize("swap", [("cid", "ifname"), ("verify", "earlier")])
def test_foreign_journal_left_by_a_cut_rebuild_is_applied_to_this_layouts_index(tmp_path, monkeypatch, swap):
    """BREAK. Promise: an index (and its journal) written under another release's FIELDS is made anew from the
    records; a rebuilt or foreign index gives the same judgement as the records.
    Reproduction: release A (FIELDS with two same-typed fields moved, e.g. cid/ifname or verify/earlier) writes
    `.index` and journal lines (an ADD after its index was written whole). This release's next call reads A's
    `.index`, sees other "fields", makes it anew and writes it whole (index.py write_whole: sd.write, then
    unlink of the journal); the call is killed between the two (the runtime's timeout SIGKILLs a plugin), or the
    journal's unlink fails otherwise. The call after reads its own `.index` (names match) plus A's journal
    lines, which carry no layout: each passes Entry.of_list's per-position checks (same types) and is applied
    in the wrong positions: the entries' keys are other attachments' (cid<->ifname), a tombstone that needs a
    look at the tables reads as one that does not (verify<->earlier: sweep.stale() drops the record unlooked).
    Root cause: plugin/cni_reaper/state/index.py _read()/_journal_changes (~l.584-590, l.428): the journal is
    applied to whatever index it sits next to; the "fields" check (decode, l.279) guards `.index` only, and
    a journal line is judged by its length and types alone (Entry.of_list l.416)."""
    root = str(tmp_path / "state")
    recs = [_record(i, tomb=(i % 2 == 1), verify=True) for i in range(4)]
    with other_layout(monkeypatch, swap):
        _call(root, *recs[:2])  # A: index written whole (new directory), then ...
        _call(root, *recs[2:])  # ... journal lines in A's layout
    assert os.path.exists(os.path.join(root, JOURNAL_NAME))

    # this release: made anew from the records, written whole; killed before the journal is removed
    def killed(self, name):
        raise KeyboardInterrupt("SIGKILL between the index's write and the journal's unlink")

    with monkeypatch.context() as m:
        m.setattr(SafeDir, "unlink_or_error", killed)
        with pytest.raises(KeyboardInterrupt):
            _call(root)
    assert os.path.exists(os.path.join(root, JOURNAL_NAME))
    assert _entries_as_read(root) == _entries_from_records(root)


def test_this_releases_journal_lines_appended_next_to_a_foreign_index_it_could_not_replace(tmp_path, monkeypatch):
    """BREAK. Promise: as above (a journal written under one layout is never applied to an index of another).
    Reproduction: release A (cid and ifname moved) leaves `.index` + a journal. This release's call finds A's
    `.index` (other fields), makes it anew from the records, but its write fails (ENOSPC on a full state
    file system: write_whole swallows the OSError, index.py ~l.657) while an append to the existing journal
    still fits (its last block has room): the ADD's record is saved and its journal line, in THIS layout,
    is appended next to A's index (Index._append, ~l.640). Back on A (rollback, or the two releases side by
    side during an upgrade of a client's plugin dir), A reads its own index (its names), and applies this
    release's line in its positions: the ADD's entry is under another key (cid and ifname exchanged).
    Root cause: index.py Index._append/_read: the journal carries no layout and is not tied to the index it
    extends; an index loaded=False whose write failed still journals."""
    root = str(tmp_path / "state")
    recs = [_record(i) for i in range(3)]
    with other_layout(monkeypatch, ("cid", "ifname")):
        _call(root, recs[0])
        _call(root, recs[1])
    real_write = SafeDir.write

    def full(self, name, data, **kw):
        if name == INDEX_NAME:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, name, data, **kw)

    with monkeypatch.context() as m:
        m.setattr(SafeDir, "write", full)
        _call(root, recs[2])
    with other_layout(monkeypatch, ("cid", "ifname")):
        as_read_by_a = _keys_as_read(root)
    assert as_read_by_a == _keys_of_records(root)


def test_held_alternating_layouts_each_call_makes_the_index_anew_and_agrees(tmp_path, monkeypatch):
    """held. Two releases of different FIELDS (cid/ifname moved) alternating calls under the lock (each saving a
    record): each reads the other's `.index` as another version, makes it anew, removes the other's journal;
    what each reads always equals its records."""
    root = str(tmp_path / "state")
    for i in range(6):
        if i % 2:
            with other_layout(monkeypatch, ("cid", "ifname")):
                _call(root, _record(i))
                _call(root, _record(i + 10))
        else:
            _call(root, _record(i))
            _call(root, _record(i + 10))
            assert _entries_as_read(root) == _entries_from_records(root)


def test_held_right_field_names_entries_of_another_length_are_made_anew(tmp_path):
    """held. An index whose "fields" are this release's names but whose entries are one longer/shorter
    (a release that changed an entry without changing FIELDS: impossible, but the CRC says nothing of it):
    Index.make refuses it (Damaged), Store.entries makes it anew from the records; no exception escapes."""
    root = str(tmp_path / "state")
    _call(root, *[_record(i, tomb=(i == 1)) for i in range(3)])
    path = os.path.join(root, INDEX_NAME)
    for delta in (+1, -1):
        with open(path, "rb") as f:
            data = f.read()
        entries, _, _ = ix.decode_all(data)
        hot, _ = ix.decode(data)
        body = {n: (v + [None] if delta > 0 else v[:-1]) for n, v in entries.items()}
        raw = [body[n] for n in hot["names"][len(hot["names"]) - len(hot["raw"]):]]
        cold = [body[n] for n in hot["names"][:len(hot["names"]) - len(hot["raw"])]]
        hot2 = dict(hot, raw=raw)
        with open(path, "wb") as f:
            f.write(ix.seal(json.dumps(hot2).encode(), json.dumps(cold).encode()))
        assert _entries_as_read(root) == _entries_from_records(root)


_REF_SCRIPT = r"""
import json, sys
from cni_reaper.state.store import Store
s = Store(sys.argv[1]).open()
with s.locked():
    got = {n: e.to_list() for n, e in s.entries().items()}
    for n in sorted(got)[:2]:  # an ADD's save: one journal line each, in 0.4.0's layout
        s.save(s.load_named(n))
print(json.dumps(got))
"""


def test_held_upgrade_from_and_rollback_to_040_with_a_cut_rebuild(tmp_path, monkeypatch):
    """held. 0.4.0 (index 8) and this release (index 9, "fields"): each reads the other's `.index` as another
    version and makes it anew; 0.4.0's journal lines have this release's FIELDS positions and types exactly
    (ref-0.4.0 index.py Entry.to_list/of_list), so even a rebuild cut between the index's write and the
    journal's unlink (the break above) gives the records' entries on both sides."""
    import subprocess
    import sys

    root = str(tmp_path / "state")
    _call(root, *[_record(i, tomb=(i % 2 == 1)) for i in range(4)])
    env = dict(os.environ, PYTHONPATH=plugin_tree(tmp_path))
    # rollback: 0.4.0 reads index 9 (made anew from the records), then saves (its journal lines)
    out = subprocess.run([sys.executable, "-c", _REF_SCRIPT, root], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    no_ino = lambda d: {n: e[1:] for n, e in d.items()}  # a save makes a new inode
    assert no_ino(json.loads(out.stdout)) == no_ino(_entries_from_records(root))
    with open(os.path.join(root, INDEX_NAME), "rb") as f:
        assert f.read().startswith(b"cni-reaper index 8\n")
    assert os.path.exists(os.path.join(root, JOURNAL_NAME))

    def killed(self, name):
        raise KeyboardInterrupt("cut")

    with monkeypatch.context() as m:  # upgrade: this release's rebuild cut before 0.4.0's journal goes
        m.setattr(SafeDir, "unlink_or_error", killed)
        with pytest.raises(KeyboardInterrupt):
            _call(root)
    assert _entries_as_read(root) == _entries_from_records(root)
    out = subprocess.run([sys.executable, "-c", _REF_SCRIPT, root], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert no_ino(json.loads(out.stdout)) == no_ino(_entries_from_records(root))


# -- 2. the --json documents' generated core schemas ---------------------------------------------------------

PLUGIN = os.path.join(os.path.dirname(__file__), "..", "..", "plugin")


def _cli(tmp_path, *args, modules: bool = False) -> subprocess.CompletedProcess:
    """The command line on a state directory under tmp_path (no conflist: the flags' directories), in a
    throwaway network namespace (unshare -n: nothing of the host's tables is even read). With `modules`, stderr's
    last line says whether pydantic / pydantic_core were loaded."""
    code = ("import sys\nfrom cni_reaper.tools import cli\nrc = cli.main(sys.argv[1:])\n"
            + ("print('MODULES', sorted(m for m in ('pydantic', 'pydantic_core') if m in sys.modules), file=sys.stderr)\n"
               if modules else "") + "sys.exit(rc)")
    flags = ["--state-dir", str(tmp_path / "state"), "--cni-conf-dir", str(tmp_path / "conf"),
             "--cni-cache-dir", str(tmp_path / "cache"), "--ipam-data-dir", str(tmp_path / "ipam")]
    for d in ("conf", "cache", "ipam"):
        os.makedirs(tmp_path / d, exist_ok=True)
    return subprocess.run(["unshare", "-n", sys.executable, "-c", code, *args, *flags], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=os.path.abspath(PLUGIN)))


def _journal(tmp_path, *lines: str) -> None:
    os.makedirs(tmp_path / "state", mode=0o700, exist_ok=True)
    (tmp_path / "state" / ".journal").write_text("".join(line + "\n" for line in lines))


def _strict_json(text: str):
    def refuse(c):
        raise ValueError(f"{c} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_journal_json_prints_nan_and_infinity_which_are_not_json(tmp_path):
    """BREAK. Promise: what `journal --json` prints is what its published schema says (journal.schema.json:
    "at" is {"type": "number"}), a JSON document.
    Reproduction: a journal line the journal's reader takes ("at": NaN, or 1e999: the JSON reader, jsonio, takes
    NaN/Infinity as `json` does, and a number too large for a float is inf); `cni-reaper journal --json` exits 0
    and prints `"at": NaN` / `"at": Infinity` (and any NaN inside "item"): no JSON parser that follows RFC 8259
    (jq, Go's encoding/json, JSON Schema validators) reads the document.
    Root cause: tools/output_checks.py SCHEMAS['journal'] 'at': {'type': 'float'} (generated from
    output.JournalEntry.at: float, which allows inf/nan: allow_inf_nan is never set false) accepts them, and
    tools/printed.py:18 json.dumps(..., allow_nan=True by default) writes them; state/journal.py:230 takes any
    float as `at`."""
    _journal(tmp_path,
             '{"t":"intent","id":"e1","at":NaN,"verb":"DEL","items":[{"key":["net","c1","eth0"],"kind":"record"}]}',
             '{"t":"intent","id":"e2","at":1e999,"verb":"DEL","items":[{"key":["net","c2","eth0"],"kind":"record"}]}')
    out = _cli(tmp_path, "journal", "--json")
    assert out.returncode == 0, out.stderr
    _strict_json(out.stdout)


def test_a_failed_check_names_neither_the_command_nor_its_document(tmp_path):
    """BREAK (clarity). Promise: a document that fails its check is a clear error, never a traceback.
    Reproduction: a journal item whose key holds a number (["net", 5, "eth0"]; journal.items takes any list of 3);
    `journal --json` exits 1 with "cni-reaper: ValidationError: 1 validation error for list[typed-dict]" and
    pydantic's multi-line text and URL: no word of which command's document, which record or which journal line;
    with TypeAdapter it said list[JournalEntry]. (No traceback: held.)
    Root cause: tools/output_checks.py checked(): SchemaValidator(SCHEMAS[name]) on typed-dict schemas without
    a cls_name/title (scripts/generate.py drops the model's name), its ValidationError passed to cli.py:124 raw."""
    _journal(tmp_path,
             '{"t":"intent","id":"e1","at":1.5,"verb":"DEL","items":[{"key":["net",5,"eth0"],"kind":"record"}]}')
    out = _cli(tmp_path, "journal", "--json")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "typed-dict" not in out.stderr and ("journal" in out.stderr.split("\n")[0] or "JournalEntry" in out.stderr)


# Not a break: `undo` without --json loads pydantic to check the journal's items by their models (issue 44
# asks for it: a command where start-up does not matter); tools/printed.py's promise is about the --json check.


@pytest.mark.parametrize("command", [["list"], ["sweep"], ["journal"], ["doctor"]])
def test_held_commands_without_json_load_no_pydantic(tmp_path, command):
    """held. list, sweep (dry), journal, doctor without --json, on a state of records of every kind and a journal:
    neither pydantic nor pydantic_core is loaded."""
    _every_kind_of_record(tmp_path)
    out = _cli(tmp_path, *command, modules=True)
    assert "MODULES []" in out.stderr, out.stderr[-500:]


def _every_kind_of_record(tmp_path) -> None:
    """Records of every kind (tombstoned with earlier lives, schema 1, plain, left, held, a later schema's whole
    and minimal, non-ASCII netns) and a journal with items of several kinds."""
    sys.path.insert(0, os.path.dirname(__file__))
    from test_schema import _valid_record

    from cni_reaper.state.names import record_name

    state = tmp_path / "state"
    os.makedirs(state, mode=0o700, exist_ok=True)
    net = "net"

    def put(doc, cid):
        doc = dict(doc, network=net, containerID=cid)
        (state / record_name(net, cid, doc["ifname"])).write_text(json.dumps(doc) + "\n")

    put(_valid_record(2), "tomb-earlier")
    put(_valid_record(1), "schema-one")
    plain = dict(_valid_record(2), deleted=None, earlier=[])
    put(plain, "plain")
    put(dict(plain, left=rec.left("no reservation shows who else holds 172.26.64.2").doc()), "left")
    put(dict(plain, left=rec.held("ipv4 nat CNI-1: still referenced", None).doc()), "held")
    put(dict(_valid_record(2), schema=4, newThing={"x": [1, 2]}), "later")
    put({"schema": 7, "network": net, "containerID": "later-min", "ifname": "eth0"}, "later-min")
    put(dict(plain, current=dict(plain["current"], netns="/var/run/netns/ünï-\u2028")), "uni")
    _journal(tmp_path,
             '{"t":"intent","id":"e1","at":1700000000.5,"verb":"DEL","items":['
             f'{{"key":["net","gone","eth0"],"kind":"reservation","network":"net","ip":"172.26.64.2","dataDir":"{tmp_path}/ipam","content":"gone\\neth0"}},'
             '{"key":["net","gone","eth0"],"kind":"conntrack","ip":"172.26.64.2","entries":3},'
             '{"key":["net","gone","eth0"],"kind":"record"},'
             '{"key":["net","gone","eth0"],"kind":"weird-future-kind","x":[1]}]}',
             '{"t":"done","id":"e1","at":1700000001.0,"removed":[0,1,2,3]}')


@pytest.mark.parametrize("command", [["list"], ["sweep"], ["journal"], ["doctor"], ["undo", "gone", "--dry-run"]])
def test_held_real_documents_are_what_the_published_schemas_say(tmp_path, command):
    """held. The documents the commands print on records of every kind (and undo's refusals: damaged items, an
    unknown kind, conntrack) pass the generated check and the published JSON Schema (jsonschema), and are
    strict JSON."""
    jsonschema = pytest.importorskip("jsonschema")
    _every_kind_of_record(tmp_path)
    out = _cli(tmp_path, *command, "--json")
    assert "Error" not in out.stderr, out.stderr
    doc = _strict_json(out.stdout)
    with open(os.path.join(PLUGIN, "..", "docs", "schemas", f"{command[0]}.schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(doc, schema)


def test_held_generated_schemas_accept_what_the_models_accept_on_odd_values():
    """held. Odd values: NaN/inf/huge int/bool/int as `at`, tuples for lists, str/int/dict subclasses, str-enum,
    lone surrogates and non-ASCII, huge ints in sweep counts: the generated core schema and the model
    (TypeAdapter) accept and refuse the same."""
    import enum

    from pydantic import TypeAdapter

    from cni_reaper.tools.output import OUTPUTS
    from cni_reaper.tools.printed import checked

    class S(str):
        pass

    class D(dict):
        pass

    class Int(int):
        pass

    class E(str, enum.Enum):
        A = "yes"

    j = dict(at=1.0, verb="DEL", key=["n", "c", "e"], kind="iptables", what="x", removed="yes", undone=False,
             stateDir="/s", item={"a": 1})
    sw = dict(applied=True, attachments={}, count=1, errors=[], skipped=[], unknown={}, backends={}, held={},
              observed={}, networks=[])
    cases = [("journal", [dict(j, at=v)]) for v in (math.nan, math.inf, 10**400, True, 3, Int(3), "1.0")]
    cases += [("journal", [dict(j, key=("a", "b", "c"))]), ("journal", [dict(j, key=["a\udcff", "ü", "\u2028"])]),
              ("journal", [dict(j, verb=S("x"))]), ("journal", [D(j)]), ("journal", [dict(j, removed=E.A)]),
              ("journal", (dict(j),)), ("journal", [dict(j, kind=None)]), ("journal", [dict(j, item=D(a=math.nan))])]
    cases += [("sweep", dict(sw, count=v)) for v in (True, 1.0, 10**30, Int(2))]
    cases += [("sweep", dict(sw, attachments={"x": ("a",)})), ("sweep", dict(sw, unknown={"x": 10**30})),
              ("undo", {"dryRun": False, "restored": [], "refused": [D(item="x", why="y")], "cannotRestore": []}),
              ("doctor", {"ok": True, "findings": [dict(status="OK", check="c", network="n", message="m", fix="",
                                                          source=S("s"))]})]
    def verdict(f, *args):
        try:
            f(*args)
            return True
        except Exception:  # noqa: BLE001
            return False

    for name, doc in cases:
        assert verdict(TypeAdapter(OUTPUTS[name]).validate_python, doc) == verdict(checked, name, doc), (name, doc)


def test_undo_dry_run_says_it_would_put_back_a_reservation_the_undo_refuses(tmp_path):
    """BREAK (found on the way, undo rather than the three changes). Promise: `undo --dry-run` reports what
    `undo` would do; undo never puts back what shadows a holder.
    Reproduction: records holding 172.26.64.2 (one "dead (held by something not ours)", others unknown), a
    journaled host-local reservation of 172.26.64.2 of a gone attachment, host-local's network directory
    absent (host-local makes it at its first ADD; an operator removed it). `undo gone --dry-run --json` lists
    the reservation under "restored" (would put back); `undo gone --json` then refuses it ("172.26.64.2 is
    held by the attachment held"). The operator is told the opposite of what happens.
    Root cause: reap/undo.py:176-178 (_reservations): a dry run with the network directory absent reports
    ok before _reservation()'s holders check (holders.of) is made."""
    _every_kind_of_record(tmp_path)
    dry = _strict_json(_cli(tmp_path, "undo", "gone", "--dry-run", "--json").stdout)
    real = _strict_json(_cli(tmp_path, "undo", "gone", "--json").stdout)
    said = [i for i in dry["restored"] if "reservation" in i]
    done = [i for i in real["restored"] if "reservation" in i]
    assert said == done, (dry, real)
