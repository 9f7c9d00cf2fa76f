"""Issue 44: the published JSON Schemas (docs/schemas/) are what the pydantic models say now, and the journal's
items are judged by their model alone (undo's check of a damaged item is the model's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_published_schemas_are_fresh():
    """scripts/schemas.py --check: a model changed and not published fails here (run scripts/schemas.py)."""
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "schemas.py"), "--check"], capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0, run.stderr


def test_a_changed_model_makes_a_schema_stale(monkeypatch):
    """The freshness check can fail: a field added to a model changes its published schema."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import schemas
    finally:
        sys.path.pop(0)
    from pydantic import create_model

    from cni_reaper.tools import output

    before = schemas.rendered()
    changed = create_model("UndoReport", __base__=output.UndoReport, note=(str, ""))
    monkeypatch.setitem(output.OUTPUTS, "undo", changed)
    after = schemas.rendered()
    assert after["undo.schema.json"] != before["undo.schema.json"] and "note" in after["undo.schema.json"]
    assert {n for n in before if before[n] != after[n]} == {"undo.schema.json"}


def test_every_published_document_names_its_schema():
    for path in sorted((REPO / "docs" / "schemas").glob("*.schema.json")):
        doc = json.loads(path.read_text())
        assert doc["$schema"].endswith("2020-12/schema") and doc["$id"] == f"cni-reaper/{path.name}"
    assert "docs/schemas/" in (REPO / "docs" / "reference.md").read_text()


GOOD = {"kind": "iptables", "key": ["net", "c1", "eth0"], "family": 4, "flavour": "nft", "table": "nat",
        "chain": "CNI-HOSTPORT-DNAT", "op": "rule", "spec": "-p tcp -j DNAT", "index": 2, "what": "a DNAT"}


@pytest.mark.parametrize("change, why", [
    ({"kind": "bogus"}, "unknown kind 'bogus'"),
    ({"family": 5}, "family"),
    ({"index": -1}, "index"),
    ({"index": True}, "index"),
    ({"spec": None}, "spec is missing"),
    ({"spec": "-j X\n-A Y"}, "spec"),
    ({"chain": "A B"}, "chain"),
    ({"table": "../nat"}, "table"),
    ({"key": ["net", "c1"]}, "key"),
])
def test_a_damaged_journal_item_is_refused_with_the_reason(change, why):
    from cni_reaper.reap.undo import damaged

    assert damaged(GOOD) is None
    problem = damaged({**GOOD, **change})
    assert problem is not None and why in problem, problem


def test_a_later_releases_item_keeps_its_new_keys():
    from cni_reaper.models import journal_item_problem

    assert journal_item_problem({**GOOD, "addedLater": {"x": 1}}) is None
