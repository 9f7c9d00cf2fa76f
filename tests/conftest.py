from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from testkit.sandbox import DEBIAN12, STACKS, binary_exe, driver_for, open_sandbox

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
def host_tables_untouched(request):
    """Fails the run if any test leaked a CNI rule into the machine's own netfilter tables (looked at only when
    a test that touches the kernel runs: the fast loop reads no table)."""
    if not _kernel_tests_selected(request.session):
        yield
        return
    before = _host_cni_lines()
    yield
    assert _host_cni_lines() == before, "a test changed the machine's own netfilter tables"


MACHINE_PATHS = ("/var/lib/cni/reaper", "/var/lib/cni/reaper-services", "/var/lib/cni/networks", "/var/lib/cni/services",
                 "/var/lib/cni/results", "/var/log/cni-reaper.log", "/opt/cni/config", "/opt/cni-reaper")


def _machine_paths() -> dict[str, list[str]]:
    out = {}
    for p in MACHINE_PATHS:
        out[p] = sorted(os.listdir(p)) if os.path.isdir(p) else (["(file)"] if os.path.exists(p) else [])
    return out


@pytest.fixture(scope="session", autouse=True)
def machine_state_untouched():
    """Fails the run if a test wrote cni-reaper's or the plugins' state into the machine's own directories
    (every test keeps it in its sandbox, mounted over /var/lib/cni and /var/log)."""
    before = _machine_paths()
    yield
    assert _machine_paths() == before, "a test wrote into the machine's own CNI state or log"


@pytest.fixture(scope="session")
def driver_bin() -> str:
    return driver_for(DEBIAN12.runtime)


@pytest.fixture(params=STACKS, ids=lambda s: s.id)
def stack(request):
    """Every combination the suite runs the Nomad scenarios on: reference plugins 1.1.1 (Debian 12) and 1.9.x
    (Debian unstable), each with the runtime of Nomad up to 1.9.4 (go-cni 1.1.7) and of Nomad 1.9.5+
    (go-cni 1.1.13, STATUS before every operation, the 1.1.0 conflists where the plugins speak 1.1.0)."""
    return request.param


@pytest.fixture(params=[STACKS[0], STACKS[2]], ids=lambda s: s.id)
def two_stacks(request):
    """For tests of cni-reaper's own machinery (failures, concurrency, the CLI): the oldest and the newest
    stack are enough."""
    return request.param


@pytest.fixture
def sb(tmp_path, flavour, package_exe, two_stacks):
    """A sandbox of the oldest and the newest stack, each iptables flavour, with the installed package (a
    module that needs another defines its own `sb`)."""
    with open_sandbox(tmp_path, flavour, package_exe, two_stacks) as s:
        yield s


@pytest.fixture
def nsb(tmp_path, package_exe):
    """One sandbox (Debian 12's stack, iptables-nft), for promises of cni-reaper's own machinery."""
    with open_sandbox(tmp_path, "nft", package_exe, DEBIAN12) as s:
        yield s


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
def sandbox(tmp_path, flavour, reaper_exe, stack):
    with open_sandbox(tmp_path, flavour, reaper_exe, stack) as sb:
        yield sb


ROOT_FIXTURES = {"private_host", "sandbox", "sb", "nsb", "native", "sandbox_root"}  # they make namespaces or need root


def pytest_collection_modifyitems(config, items):
    """What needs root or namespaces is marked `netns` whether its module says so or a fixture it asks for
    does, so that `-m "not netns"` leaves only what runs without root."""
    for item in items:
        if ROOT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.netns)


def _kernel_tests_selected(session) -> bool:
    return any(item.get_closest_marker("netns") for item in session.items)
