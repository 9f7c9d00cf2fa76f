"""An earlier release's own code, taken from git (the release's commit), so that rollback and upgrade tests run
on any clone with history: CI's too. A clone without the commit skips them (fails them in the full run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

RELEASE_040 = "104b18b"  # scripts/bench.py REFERENCES["0.4.0"]
REPO = Path(__file__).resolve().parents[2]


def plugin_tree(where: Path, commit: str = RELEASE_040) -> str:
    """The `plugin` directory of `commit`, extracted under `where` once: what PYTHONPATH names to run it."""
    tree = where / f"release-{commit}"
    if not (tree / "plugin").is_dir():
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "plugin"], capture_output=True)
        if archive.returncode != 0:
            why = f"release {commit} is not in this clone: {archive.stderr.decode()[:200]}"
            if os.environ.get("CNI_REAPER_FULL_RUN"):
                pytest.fail(why)
            pytest.skip(why)
        tree.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return str(tree / "plugin")
