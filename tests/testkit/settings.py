"""A settings file of wrapped networks, as a wrapped call reads it and as doctor checks it (cni/settings_file.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def read_three_ways(tmp_path: Path, text: str) -> tuple[Any, Any, Any]:
    """Write `text` as a settings file root alone may write; return (what a wrapped call reads: SettingsFile,
    the modes every pass would take from it: judge.modes.ModeSources, doctor's finding of it)."""
    from cni_reaper.cni import settings_file
    from cni_reaper.state.modes import sources
    from cni_reaper.tools.doctor import check_settings_file

    d = tmp_path / "etc"
    d.mkdir(mode=0o755, exist_ok=True)
    path = d / "config.json"
    path.write_text(text)
    os.chmod(path, 0o644)
    s = settings_file.load({"CNI_REAPER_CONFIG": str(path)})
    return s, sources({}, {}, s), check_settings_file(str(path))[0]
