from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sandbox import Sandbox, binary_exe, build_driver, needs_root  # noqa: E402

FLAVOURS = ("nft", "legacy")


def _host_cni_lines() -> dict[str, list[str]]:
    """CNI artifacts in the machine's own tables (both flavours, both families)."""
    out = {}
    for tool in ("iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"):
        if shutil.which(tool):
            text = subprocess.run([tool], capture_output=True, text=True).stdout
            out[tool] = sorted(l for l in text.splitlines() if "CNI-" in l or "cni-reaper" in l or "NOMAD-ADMIN" in l)
    return out


@pytest.fixture(scope="session", autouse=True)
def host_tables_untouched():
    """Fails the run if any test leaked a CNI rule into the machine's own netfilter tables."""
    before = _host_cni_lines()
    yield
    assert _host_cni_lines() == before, "a test changed the machine's own netfilter tables"


@pytest.fixture(scope="session")
def driver_bin() -> str:
    try:
        return build_driver()
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _package_exe() -> str:
    exe = shutil.which("cni-reaper", path=os.path.dirname(sys.executable))
    if not exe:
        pytest.fail("cni-reaper is not installed in this environment: pip install .")
    return exe


@pytest.fixture(params=["package", "binary"])
def reaper_exe(request) -> str:
    """The installed package's entry point and the PyInstaller bundle: both are exercised."""
    return _package_exe() if request.param == "package" else binary_exe()


@pytest.fixture
def package_exe() -> str:
    return _package_exe()


@pytest.fixture(params=FLAVOURS)
def flavour(request) -> str:
    return request.param


@pytest.fixture
def sandbox(tmp_path, flavour, reaper_exe, driver_bin):
    needs_root()
    with Sandbox(tmp_path, flavour, reaper_exe, driver_bin) as sb:
        yield sb


@pytest.fixture
def quick_sandbox(tmp_path, package_exe, driver_bin):
    """One flavour, the package: for protocol tests that do not depend on netfilter."""
    needs_root()
    with Sandbox(tmp_path, "nft", package_exe, driver_bin) as sb:
        yield sb
