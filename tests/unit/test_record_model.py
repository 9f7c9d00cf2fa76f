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
TWINS = {record.NetnsId: models.NetnsId, record.DirId: models.DirId, record.HostId: models.HostId,
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
    assert typed.doc() == record.upgrade(json.loads(json.dumps(doc)))
    models.Record.model_validate_json(json.dumps(typed.doc()))
    assert record.Record.of(typed.doc()) == typed


def test_what_the_builders_make_is_a_document_of_the_schema():
    doc = _valid_record()
    assert record.problem(doc) is None and models.record_problem(doc) is None
    typed = record.of_document(doc)
    assert typed.current.ips[0].reservation is not None and typed.current.ports[0].host_port == 8080
    assert typed.key == ("nomad-reaper", "alloc-1", "eth0") and typed.deleted is not None and typed.deleted.cached


# The JSON keys only a record has: read anywhere but state/record.py, the layout has a second owner. (Keys
# records share with other documents, such as "network", "ips" or "portMappings" in a CNI result or a
# journal item, cannot be told apart by their spelling; their readers are those documents' own.)
RECORD_ONLY = {"current", "earlier", "deleted", "netnsId", "netnsDir", "createdAt", "cniArgs", "pluginVersion",
               "reservation", "retryAt", "netnsGone", "hadPrevResult", "hadPortMappings", "ipamDataDir", "cniCacheDir",
               "veth", "settings", "schema"}
OWNER = PACKAGE / "state" / "record.py"
MODELS = PACKAGE / "models.py"  # the schema itself


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


def _layout_reads() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in (OWNER, MODELS):
            continue
        for line, key in _reads(ast.parse(path.read_text())):
            if key in RECORD_ONLY:
                found.append(f"{path.relative_to(PACKAGE)}:{line}: {key!r}")
    return found


# Other things spelled as a record's key, each with what it is (not a record).
NOT_RECORDS = {
    ("reap/cleanup.py", "reservation"): "a part of a clean-up's target (targets.PARTS)",
    ("tools/undo.py", "reservation"): "a journal item's kind",
}


def test_no_module_but_record_py_reads_a_record_by_its_keys():
    bad = [f for f in _layout_reads() if (f.split(":")[0], f.split(": ")[1].strip("'")) not in NOT_RECORDS]
    assert bad == []


def test_the_layout_check_sees_a_record_read_by_its_keys(tmp_path):
    """The check above fails on what it is to catch (a module reading a record's life by key)."""
    tree = ast.parse('def f(r):\n    return r["current"]["netnsId"], r.get("deleted"), "retryAt" in r["left"]\n')
    assert {k for _, k in _reads(tree)} >= {"current", "netnsId", "deleted", "retryAt"}
