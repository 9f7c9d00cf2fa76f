"""The Prometheus rules and the Grafana dashboard shipped in the release (build/monitoring): promtool accepts
the rules and their unit tests (tests.yml) pass; every rule is tested, so that breaking any alert's or
recording rule's expression fails them; the real `cni-reaper metrics` text passes `promtool check metrics`;
the rules and the dashboard's queries name only metrics that text has (node_exporter's textfile mtime
aside); and the tarball and the .deb (scripts/package.sh, on a stand-in bundle) ship all three files."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cni_reaper.reap.outcome import Outcome
from cni_reaper.state import counters
from cni_reaper.state.store import Store
from cni_reaper.values import Key
from testkit.records import bare
from testkit.tools import needs_tool

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "build" / "monitoring"
RULES, TESTS, DASHBOARD = (MONITORING / n for n in ("cni-reaper.rules.yml", "tests.yml", "cni-reaper-dashboard.json"))
SHIPPED = (RULES, TESTS, DASHBOARD)
PROMTOOL_HOW = "scripts/setup.sh extracts it from Debian's prometheus package"
NODE_EXPORTER = {"node_textfile_mtime_seconds"}  # the textfile's age: node_exporter's, not cni-reaper's
METRIC = re.compile(r"\b(?:cni_reaper|node)_[a-z_]+\b")
# one rule of the rules file: its kind, its name, and its expression (one line, or a folded block)
RULE = re.compile(r"^      - (alert|record): (\S+)\n(?:        #.*\n)*        expr: (>-\n(?:          .*\n)+|.*\n)", re.M)


@pytest.fixture(scope="module")
def promtool() -> str:
    return needs_tool("promtool", PROMTOOL_HOW)


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)


def rules() -> list[tuple[str, str, str]]:
    """(kind, name, expression) of every rule in the shipped rules file."""
    return [(kind, name, " ".join(expr.removeprefix(">-").split())) for kind, name, expr in RULE.findall(RULES.read_text())]


def test_promtool_accepts_the_rules_and_their_tests_pass(promtool):
    checked = run(promtool, "check", "rules", str(RULES))
    assert checked.returncode == 0 and f"SUCCESS: {len(rules())} rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = run(promtool, "test", "rules", TESTS.name, cwd=MONITORING)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def groups_testing(name: str) -> str:
    """tests.yml cut to the test groups that name rule `name` (an alert's alertname, a recording rule's
    expr): what a broken copy of that rule is run against (the whole file takes a second per run)."""
    head, _, body = TESTS.read_text().partition("\ntests:\n")
    groups = re.split(r"\n(?=  - )", body)
    return head + "\ntests:\n" + "\n".join(g for g in groups if re.search(rf"(alertname|expr): {re.escape(name)}\n", g))


def test_every_alert_and_recording_rule_is_tested(promtool, tmp_path):
    """Each rule's expression replaced by one that yields nothing, in a copy of the rules: the unit tests that
    name it fail, for every one (one promtool run over all the copies, each judged by its own verdict)."""
    found = rules()
    assert {kind for kind, _, _ in found} == {"alert", "record"} and len(found) >= 8
    text = RULES.read_text()
    files = []
    for i, (_, name, _) in enumerate(found):
        match = next(m for m in RULE.finditer(text) if m.group(2) == name)
        where = tmp_path / f"broken-{i}"
        where.mkdir()
        (where / RULES.name).write_text(text[:match.start(3)] + "vector(1) unless vector(1)\n" + text[match.end(3):])
        tests = groups_testing(name)
        assert "  - interval:" in tests, f"no test names {name}"
        (where / TESTS.name).write_text(tests)
        files.append(str(where / TESTS.name))
    proc = run(promtool, "test", "rules", *files)
    assert proc.returncode != 0 and proc.stdout.count("Unit Testing:") == len(files), proc.stdout + proc.stderr
    passed = re.findall(r"Unit Testing:\s+(\S+)\n\s+SUCCESS", proc.stdout)  # a failure's report is on stderr
    assert [found[files.index(f)][1] for f in passed] == [], "rules whose broken expression no test catches"


def _outcome(network: str, failed: bool = False) -> Outcome:
    out = Outcome()
    for kind, n in (("masquerade", 2), ("dnat", 3), ("reservation", 1), ("conntrack", 4)):
        out.note(Key(network, "c1", "eth0"), f"{kind} item", kind, n)
    if failed:
        out.failed.add(Key(network, "c2", "eth0"))
        out.errors.append("ipv4: boom")
    return out


@pytest.fixture
def exposition(tmp_path, package_exe) -> str:
    """`cni-reaper metrics` (the installed entry point) on a state directory with records and every counter
    made: clean-ups (one that failed), sweeps by two verbs, observe mode, the scheduler's word, an ADD that
    could not record its attachment."""
    state = tmp_path / "state"
    store = Store(str(state)).open()
    with store.locked():
        store.save(bare("services", "alive", netns="/proc/self/ns/net"))
        store.save(bare("services", "gone", netns=str(state / "no-such-netns")))
        counters.add(store, _outcome("services"), {"services": 1}, 0.02)
        counters.add(store, _outcome("services", failed=True), {"services": 1}, 1.5)
        counters.add_would(store, {("web", "dnat"): 2})
        counters.add_by_kind(store, "schedulersWord", {("services", "attachments"): 1, ("services", "namespaces"): 1})
        counters.word_asked(store, True, 1000.0)
        counters.word_asked(store, False, 2000.0)
    store.close()
    counters.unrecorded(str(state))
    empty = tmp_path / "no-conflists"
    empty.mkdir()
    proc = run(package_exe, "metrics", "--cni-conf-dir", str(empty), "--state-dir", str(state))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def names(text: str) -> set[str]:
    """The metric names (samples: a histogram's _bucket, _sum and _count) of an exposition."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_real_metrics_pass_promtool_check_metrics(promtool, exposition):
    got = names(exposition)
    assert {"cni_reaper_removed_total", "cni_reaper_records", "cni_reaper_sweep_duration_seconds_bucket",
            "cni_reaper_would_remove_total", "cni_reaper_schedulers_word_total",
            "cni_reaper_schedulers_word_unavailable_timestamp_seconds"} <= got
    assert 'cni_reaper_unrecorded_attachments_total 1' in exposition  # every counter made something to check
    proc = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stdout + proc.stderr


def test_the_rules_name_only_metrics_cni_reaper_prints(exposition):
    printed = names(exposition) | NODE_EXPORTER
    for _, name, expr in rules():
        named = set(METRIC.findall(expr))
        assert named and named <= printed, (name, named - printed)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) of every query of the dashboard, its variables' included."""
    doc = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v["definition"]) for v in doc["templating"]["list"] if v["type"] == "query"]
    return out


def test_the_dashboard_queries_only_metrics_cni_reaper_prints(promtool, exposition, tmp_path):
    """Valid JSON whose every query names metrics `cni-reaper metrics` prints (no others) and parses as PromQL
    (promtool checks each as a recording rule); the panels the operator needs are there."""
    printed = names(exposition)
    queries = dashboard_queries()
    for title, expr in queries:
        named = set(METRIC.findall(expr))
        assert named and named <= printed, (title, named - printed)
    assert {"cni_reaper_removed_total", "cni_reaper_records", "cni_reaper_sweep_duration_seconds_bucket",
            "cni_reaper_cleanup_failures_total"} <= {m for _, e in queries for m in METRIC.findall(e)}
    promql = [e for t, e in queries if not t.startswith("variable ")]
    rules_file = tmp_path / "dashboard.rules.yml"
    rules_file.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(promql)]}]}))
    proc = run(promtool, "check", "rules", str(rules_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _stand_in_bundle(where: Path) -> Path:
    bundle = where / "bundle"
    (bundle / "cni-reaper.lib").mkdir(parents=True)
    (bundle / "cni-reaper").write_text("#!/bin/sh\n")
    (bundle / "cni-reaper").chmod(0o755)
    (bundle / "cni-reaper.lib" / "base_library.zip").write_bytes(b"")
    return bundle


def test_the_tarball_and_the_deb_ship_the_rules_their_tests_and_the_dashboard(tmp_path):
    """scripts/package.sh (what release.sh packages each architecture's bundle with), on a stand-in bundle:
    monitoring/ in the tarball, /usr/share/cni-reaper/monitoring/ in the .deb, the files as in build/."""
    needs_tool("dpkg-deb", "Debian's dpkg")
    out = tmp_path / "dist"
    out.mkdir()
    proc = run(str(REPO / "scripts" / "package.sh"), "amd64", str(_stand_in_bundle(tmp_path)), str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [tgz], [deb] = sorted(out.glob("*.tgz")), sorted(out.glob("*.deb"))
    with tarfile.open(tgz) as tar:
        assert {n.split("/")[0] for n in tar.getnames()} == {"cni-reaper", "cni-reaper.lib", "wrap", "monitoring"}
        for shipped in SHIPPED:
            member = tar.getmember(f"monitoring/{shipped.name}")
            assert member.mode == 0o644 and tar.extractfile(member).read() == shipped.read_bytes()
    files = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    (tmp_path / "deb.tar").write_bytes(files)
    with tarfile.open(tmp_path / "deb.tar") as tar:
        for shipped in SHIPPED:
            member = tar.getmember(f"./usr/share/cni-reaper/monitoring/{shipped.name}")
            assert (member.mode, member.uid) == (0o644, 0) and tar.extractfile(member).read() == shipped.read_bytes()
        assert tar.getmember("./usr/lib/cni-reaper/cni-reaper").mode == 0o755
