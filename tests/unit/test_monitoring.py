"""What ships for a fleet (issue 45): the Prometheus rules and alerts, tested with promtool's own unit tests
(each alert fires when it should and not before), checked against the real `cni-reaper metrics` output, and
a Grafana dashboard whose every query names a metric that output has. No root needed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cni_reaper.reap.outcome import Outcome
from cni_reaper.state import counters
from cni_reaper.tools.metrics import exposition
from cni_reaper.values import Key
from testkit.tools import needs_tool

MONITORING = Path(__file__).resolve().parents[2] / "build" / "monitoring"
RULES, RULE_TESTS = MONITORING / "cni-reaper.rules.yml", MONITORING / "cni-reaper.rules.test.yml"
DASHBOARD = MONITORING / "cni-reaper-dashboard.json"
HOW = "scripts/setup.sh puts Debian's promtool (package prometheus) in .venv/bin"


def _promtool() -> str:
    beside = Path(sys.executable).parent / "promtool"
    return str(beside) if beside.exists() else needs_tool("promtool", HOW)


def _text() -> str:
    """What `cni-reaper metrics` prints for a state directory that has cleaned, failed and observed."""
    out = Outcome()
    out.note(Key("nomad", "c1", "eth0"), "masquerade chain", "masquerade", 2)
    out.failed.add(Key("nomad", "c2", "eth0"))
    c = counters.count(counters.empty(), out, {"nomad": 1}, 0.03, "DEL", now=100.0)
    c["wouldRemove"] = {"nomad": {"dnat": 1}}
    c["unrecorded"] = 1
    return exposition(c, {("nomad", "live"): 3, ("nomad", "held"): 1}, ["nomad"])


def _families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_every_alert_fires_when_it_should_and_not_before():
    proc = subprocess.run([_promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, cwd=MONITORING)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_broken_alert_fails_the_rule_tests(tmp_path):
    """The rule tests can fail: an alert whose threshold is broken on purpose is caught."""
    for name in (RULES.name, RULE_TESTS.name):
        (tmp_path / name).write_text((MONITORING / name).read_text())
    broken = tmp_path / RULES.name
    broken.write_text(broken.read_text().replace("increase(cni_reaper_cleanup_failures_total[1h]) > 0",
                                                 "increase(cni_reaper_cleanup_failures_total[1h]) > 100"))
    proc = subprocess.run([_promtool(), "test", "rules", RULE_TESTS.name], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0 and "CniReaperCleanupFailing" in proc.stdout + proc.stderr


def test_the_rules_are_valid_and_name_only_metrics_cni_reaper_exposes():
    proc = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    have = _families(_text())
    named = set(re.findall(r"(?<![:\w])cni_reaper_[a-z_]+", RULES.read_text()))  # not the recording rules
    assert named and named <= have, named - have


def test_the_metrics_text_passes_promtools_lint():
    proc = subprocess.run([_promtool(), "check", "metrics"], input=_text(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_dashboard_query_names_a_metric_cni_reaper_exposes():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    have = _families(_text())
    named = {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"\bcni_reaper_[a-z_]+", e)}
    assert len(exprs) >= 8 and named <= have, named - have
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for wanted in ("removed", "records by state", "sweep duration", "failures"):
        assert wanted in titles


@pytest.mark.parametrize("path", [RULES, RULE_TESTS])
def test_the_rule_files_are_yaml_a_person_can_read(path):
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(path.read_text())
