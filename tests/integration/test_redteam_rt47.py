"""Red team rt47: the settings file as `cni-reaper doctor` checks it (a8c1fb1)."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.netns


def test_doctor_on_a_settings_file_whose_network_name_is_a_lone_surrogate_gives_no_traceback(sb, tmp_path):
    """BREAK, minor (every user-facing failure is a clear error). The settings file
    {"networks": {"\\ud800": {"mode": "x"}}} is valid JSON to jsonio (a lone surrogate escape). `cni-reaper
    doctor --config FILE`: the new settings-file check (a8c1fb1) prints its WARN fine (replacement chars), but
    a later finding that names the network is printed to a UTF-8 stdout: doctor stops with
    "cni-reaper: UnicodeEncodeError: 'utf-8' codec can't encode character '\\ud800' ... surrogates not
    allowed", exit 1, the remaining checks unsaid. No traceback (held). Not new in a8c1fb1 (the wrapped
    networks' checks named the network before). Reproduce: write that file (root's, 0644), run doctor."""
    conf_dir = tmp_path / "etc-rt47"
    conf_dir.mkdir(mode=0o755)
    path = conf_dir / "config.json"
    path.write_text('{"networks": {"\\ud800": {"mode": "x"}}}')
    os.chmod(path, 0o644)
    out = sb.cli("doctor", "--config", str(path))
    assert "Traceback" not in out.stderr, out.stderr[-2000:]  # held: no traceback
    # but doctor stops half-way with a bare Python error, its other checks unsaid
    assert "UnicodeEncodeError" not in out.stderr, out.stderr[-2000:]
