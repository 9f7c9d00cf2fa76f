"""One typed model of a record (issue 32, item 1): state/record.py is the one module that knows a record's layout
on disk. Its typed classes are held here to their pydantic twins in models.py (the one schema) field by field,
every document the check accepts reads and writes back key for key, and no other module of plugin/ reads a
record, a life or a part of one by its JSON key."""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from test_schema import EXAMPLES, _valid_record, records

from cni_reaper import models
from cni_reaper.state import record

PACKAGE = Path(record.__file__).resolve().parents[1]

# each typed class and its twin in models.py (Left: the held mark, whose keys are a plain mark's and two more)
TWINS: dict[type[record.Part], type[models.BaseModel]] = {
         record.NetnsId: models.NetnsId, record.DirId: models.DirId, record.HostId: models.HostId,
         record.Veth: models.Veth, record.ReservationId: models.ReservationId, record.RecordedIP: models.RecordedIP,
         record.RecordedPortMapping: models.RecordedPortMapping, record.Life: models.Life,
         record.Tombstone: models.Tombstone, record.Left: models.Held, record.RecordSettings: models.RecordSettings,
         record.Record: models.Record}


def _nested(annotation: typing.Any) -> type | None:
    """The pydantic model a field of a model holds (itself, in a list, or optional), None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, models.BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        inner = _nested(arg)
        if inner is not None:
            return inner
    return None


@pytest.mark.parametrize("plain,model", TWINS.items(), ids=[c.__name__ for c in TWINS])
def test_every_typed_class_has_its_schema_twins_fields_in_its_one_table(plain, model):
    keys = [k for _, k, _ in plain._fields]
    assert sorted(keys) == sorted(f.alias or n for n, f in model.model_fields.items())
    assert sorted(slot for slot, _, _ in plain._fields) == sorted(plain.__slots__)  # every slot is in the table
    for slot, key, kind in plain._fields:
        name = next(n for n, f in model.model_fields.items() if (f.alias or n) == key)
        twin = _nested(model.model_fields[name].annotation)
        part = kind.part if isinstance(kind, record.Many) else kind
        if twin is None:
            assert part is None, (plain.__name__, slot)
        else:  # a nested part is read as its own twin (Left: the held mark's twin stands for either mark)
            assert part is not None and TWINS[part] in (twin, models.Held), (plain.__name__, slot, twin)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(records())
def test_every_document_the_check_accepts_reads_and_writes_back_key_for_key(doc):
    if record.problem(doc) is not None:
        return
    typed = record.of_document(json.loads(json.dumps(doc)))
    expected = record.upgrade(json.loads(json.dumps(doc)))
    if "left" in expected and expected["left"] is None:
        del expected["left"]  # a null `left` is written back absent (state/record.py: every reader takes them alike)
    assert typed.doc() == expected
    models.Record.model_validate_json(json.dumps(typed.doc()))
    assert record.Record.of(typed.doc()) == typed


def test_what_the_builders_make_is_a_document_of_the_schema():
    doc = _valid_record()
    assert record.problem(doc) is None and models.record_problem(doc) is None
    typed = record.of_document(doc)
    assert typed.current.ips[0].reservation is not None and typed.current.port_mappings[0].host_port == 8080
    assert typed.key == ("nomad-reaper", "alloc-1", "eth0") and typed.deleted is not None and typed.deleted.cached


# A record as cni-reaper 0.4.0 wrote it, byte for byte (its builders' key order), every number distinct so that
# a field read from another key shows: the one layout, anchored outside the code that reads and writes it.
GOLDEN = (
    '{"schema": 2, "network": "nomad", "containerID": "alloc-1", "ifname": "eth0", "current": {"netns": '
    '"/var/run/netns/alloc-1", "netnsId": {"dev": 4, "ino": 4026532177, "ctime": 1796114877312865396}, "netnsDir": '
    '{"dev": 26, "ino": 2, "groups": [1, 7]}, "host": {"boot": "b-1", "machine": "m-1", "netns": 4026531833, "mnt": '
    '4026531832}, "veth": {"name": "veth1a2b3c4d", "ifindex": 7}, "ips": [{"address": "172.26.64.2", "prefix": 20, '
    '"family": 4, "reservation": {"dev": 65024, "ino": 12, "mtime": 1796114877000000001, "ctime": 1796114877000000002, '
    '"dataDir": "/var/lib/cni/networks"}}], "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", '
    '"hostIP": "10.0.0.1"}], "createdAt": "2026-11-29T19:33:41.123456Z"}, "earlier": [], "cniArgs": {"K": "V"}, '
    '"settings": {"ipamDataDir": "/i", "cniCacheDir": "/c", "backend": "iptables"}, "pluginVersion": "0.4.0", '
    '"deleted": {"at": "2026-11-29T19:34:00Z", "netnsGone": true, "hadPrevResult": false, "hadPortMappings": true, '
    '"verify": false, "cached": null}, "left": {"at": "2026-11-29T19:35:00Z", "why": "held", "retryAt": '
    '"2026-11-29T19:36:00Z", "tries": 3}}'
)


def test_a_record_as_written_reads_into_the_right_fields_and_writes_back_byte_for_byte():
    doc = json.loads(GOLDEN)
    assert record.problem(doc) is None and models.record_problem(doc) is None
    r = record.of_document(doc)
    cur = r.current
    assert (r.network, r.container_id, r.ifname, r.cni_args, r.plugin_version) == ("nomad", "alloc-1", "eth0", {"K": "V"}, "0.4.0")
    assert cur.netns_id == record.NetnsId(4, 4026532177, 1796114877312865396)
    assert cur.netns_dir == record.DirId(26, 2, (1, 7)) and cur.veth == record.Veth("veth1a2b3c4d", 7)
    assert cur.host == record.HostId("b-1", "m-1", 4026531833, 4026531832)
    assert cur.ips[0].reservation == record.ReservationId("/var/lib/cni/networks", 65024, 12, 1796114877000000001,
                                                          1796114877000000002)
    assert cur.port_mappings == (record.RecordedPortMapping(8080, 80, "tcp", "10.0.0.1"),)
    assert r.settings == record.RecordSettings("/i", "/c", "iptables")
    assert r.deleted == record.Tombstone("2026-11-29T19:34:00Z", True, False, True, False, None)
    assert r.left == record.Left("2026-11-29T19:35:00Z", "held", "2026-11-29T19:36:00Z", 3)
    assert r.written() == doc  # every key back, with its value (in the schema written: 2)
    assert r.schema == 3 and r.written_by is None  # in memory: schema 3, whose writtenBy a schema 2 record lacks
    # in the models' order (state/record_checks.py): inherited fields first (ips before netnsDir since 0.6)
    order = [k for _, k, _ in record.Life._fields]
    assert list(r.doc()["current"]) == order and order.index("ips") < order.index("netnsDir")
    # a mark the schema lets be null or absent is read as none and written absent (what the builders write)
    unmarked = {k: v for k, v in doc.items() if k != "left"}
    assert record.of_document(dict(doc, left=None)).written() == unmarked == record.of_document(unmarked).written()


# Every JSON key a record has. The keys only a record has may be read nowhere but in state/record.py (and
# models.py, the schema); the keys it shares with other documents only by the modules that read those.
RECORD_KEYS = {k for part in TWINS for _, k, _ in part._fields}
RECORD_ONLY = {"current", "earlier", "deleted", "netnsId", "netnsDir", "createdAt", "cniArgs", "pluginVersion",
               "reservation", "retryAt", "netnsGone", "hadPrevResult", "hadPortMappings", "ipamDataDir", "cniCacheDir",
               "veth", "settings", "schema", "groups", "boot", "machine", "mnt", "ifindex", "tries", "writtenBy"}
OWNER = PACKAGE / "state" / "record.py"
MODELS = PACKAGE / "models.py"  # the schema itself
GENERATED = PACKAGE / "state" / "record_checks.py"  # the record's checks, generated from MODELS
# the modules that read other documents spelled with some of a record's keys, and which documents
OTHER_DOCUMENTS = {
    "cni/conf.py": "the CNI configuration (runtimeConfig.portMappings, backend)",
    "cni/result.py": "a CNI result (ips, interfaces)",
    "cni/shell.py": "the CNI configuration",
    "reap/cache.py": "libcni's cache entries",
    "reap/holders.py": "nft's JSON rules",
    "reap/netfilter/nftables/backend.py": "nft's JSON listing",
    "reap/netfilter/nftables/rules.py": "nft's JSON rules",
    "state/index.py": "the index's own parts",
    "state/journal.py": "journal items",
    "reap/undo.py": "journal items",
    "tools/cmd_list.py": "`list`'s own items",
    "tools/cmd_journal.py": "journal items",
    "tools/cmd_undo.py": "journal items",
    "tools/conflists.py": "conflists",
    "tools/context.py": "the CLI's flags, as configuration keys",
    "tools/doctor.py": "conflists",
    "verbs/gc.py": "GC's valid attachments",
    "wrap/wrapper.py": "the CNI configuration",
}
# a key only a record has, spelled so for another thing
NOT_RECORDS = {
    ("reap/cleanup.py", "reservation"): "a part of a clean-up's target (targets.PARTS)",
    ("reap/undo.py", "reservation"): "a journal item's kind",
}


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of every read of a constant string key: x["k"], x.get("k"), "k" in x."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            out.append((node.lineno, node.slice.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop", "setdefault")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)
              and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)):
            out.append((node.lineno, node.left.value))
    return out


def _layout_reads(root: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """(module, line, key) of every read of a record's key by a module that is not the record's."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path in (OWNER, MODELS, GENERATED):
            continue
        name = str(path.relative_to(root))
        for line, key in _reads(ast.parse(path.read_text())):
            only = key in RECORD_ONLY and (name, key) not in NOT_RECORDS
            shared = key in RECORD_KEYS and key not in RECORD_ONLY and name not in OTHER_DOCUMENTS
            if only or shared:
                found.append((name, line, key))
    return found


def test_no_module_but_record_py_reads_a_record_by_its_keys():
    assert _layout_reads() == []


def test_the_layout_check_sees_a_record_read_by_its_keys(tmp_path):
    """The check above fails on what it is to catch: a module reading a record's parts by key, whether keys only
    a record has or keys it shares (the exemptions are per module and per key)."""
    mod = tmp_path / "reap" / "sweep.py"
    mod.parent.mkdir()
    mod.write_text('def f(r, life):\n    return r["current"]["netnsId"], r.get("deleted"), "retryAt" in r["left"], '
                   'life["ips"], r["left"]["why"], r["network"]\n')
    assert {k for _, _, k in _layout_reads(tmp_path)} == {"current", "netnsId", "deleted", "retryAt", "ips", "left",
                                                          "why", "network"}
    (tmp_path / "reap" / "cleanup.py").write_text('def g(t):\n    return "reservation" in t.parts, t["current"]\n')
    assert {(m, k) for m, _, k in _layout_reads(tmp_path)} >= {("reap/cleanup.py", "current")}
    assert ("reap/cleanup.py", "reservation") not in {(m, k) for m, _, k in _layout_reads(tmp_path)}
