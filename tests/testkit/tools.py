"""Tools a test needs from the machine: missing, the test skips and says which, in the fast loop; in the full
run (scripts/test.sh sets CNI_REAPER_FULL_RUN, having installed them all) a missing tool fails it instead,
so that nothing CI should cover is skipped unseen."""

from __future__ import annotations

import os
import shutil

import pytest


def needs_tool(name: str, how: str) -> str:
    """The path of tool `name`; skips (fails in the full run) when it is missing, saying `how` to get it."""
    found = shutil.which(name)
    if found is None:
        why = f"{name} is not installed ({how})"
        if os.environ.get("CNI_REAPER_FULL_RUN"):
            pytest.fail(why)
        pytest.skip(why)
    return found
