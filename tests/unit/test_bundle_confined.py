"""The build's foreign programs (scripts/bundle.py: PRoot and qemu-user) run where nothing but their root can be
written: PRoot translates their paths only while it lives, and a second stage whose PRoot was killed once
unpacked arm64's tar over the build machine's own. The confinement is tried here on a host program in a
throwaway mount namespace: the machine's files cannot be written, the root can, and the machine is untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bundle

pytestmark = pytest.mark.netns  # a mount namespace of its own, made and gone with the command


def _confined(root: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           bundle.confined(root) + script], capture_output=True, text=True, timeout=30)


def test_a_confined_command_writes_its_root_and_nothing_of_the_machines(tmp_path):
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    probe = Path("/usr/local/cni-reaper-confined-probe")
    assert not probe.exists()
    try:
        proc = _confined(root, f'touch "{root}/tmp/inside" && ! touch "{probe}" 2>/dev/null && '
                               f'touch "{tmp_path}/scratch" && echo confined')
    finally:
        probe.unlink(missing_ok=True)  # were it not confined, the probe is not left behind
    assert proc.returncode == 0 and proc.stdout.strip() == "confined", proc.stderr
    assert (root / "tmp" / "inside").exists() and not probe.exists()
    assert (tmp_path / "scratch").exists()  # /tmp stays writable (PRoot's own files), wherever it is mounted
    # the machine's own mounts are as they were
    assert not any(" ro," in line and line.split()[1] == "/" for line in Path("/proc/self/mounts").read_text().splitlines())


def test_a_foreign_command_line_is_confined():
    have = bundle.shutil.which("proot") and bundle.shutil.which(bundle.QEMU["arm64"])
    argv = bundle.foreign(Path("/tmp/r"), "arm64", ["/bin/true"]) if have else None
    if argv is None:
        pytest.skip("proot is not installed here (the release build installs it)")
    assert argv[6].startswith(bundle.confined(Path("/tmp/r")))
