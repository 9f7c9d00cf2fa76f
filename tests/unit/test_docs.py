"""The docs name only what exists: every path, module and test file that README.md, CONTRIBUTING.md,
CHANGELOG.md and docs/*.md name is in the tree (a rename that leaves a doc behind fails here)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
# a path in the tree: a top-level folder of the repository, or a module path inside the package
NAMED = re.compile(r"(?<![\w/.$-])((?:plugin|tests|scripts|conflist|build|docs|reap|state|verbs|cni|tools|wrap|"
                   r"testkit|integration|unit|\.ci)/[\w./-]*[\w])")
TEST_FILE = re.compile(r"(?<![\w/.-])(test_\w+\.py)\b")
WHERE = [REPO, REPO / "plugin" / "cni_reaper", REPO / "tests", REPO / "tests" / "integration", REPO / "tests" / "unit"]
NOT_OURS = ("wrap/portmap", "build/work", "cni/nomad-reaper")  # made by builds or installs; a Nomad network mode


def named(text: str) -> set[str]:
    found = {m.rstrip(".") for m in NAMED.findall(text)}
    return {p for p in found if not p.startswith(NOT_OURS) and "<" not in p and "*" not in p} | set(TEST_FILE.findall(text))


def missing(text: str) -> list[str]:
    return sorted(p for p in named(text) if not any((base / p).exists() for base in WHERE))


def test_every_doc_exists_and_the_readme_links_them():
    readme = (REPO / "README.md").read_text()
    for doc in DOCS:
        assert doc.exists(), doc
        if doc.name != "README.md":
            assert str(doc.relative_to(REPO)) in readme, f"the README does not link {doc.relative_to(REPO)}"


def test_every_path_the_docs_name_exists():
    problems = {str(d.relative_to(REPO)): missing(d.read_text()) for d in DOCS}
    assert {d: m for d, m in problems.items() if m} == {}


def test_a_renamed_file_is_caught():
    assert missing("see `reap/claims.py` and tests/integration/test_preexisting.py") == []
    assert missing("see `reap/claimz.py`, test_nothing_here.py") == ["reap/claimz.py", "test_nothing_here.py"]


def test_the_readme_is_for_operators():
    assert len((REPO / "README.md").read_text().splitlines()) < 500
