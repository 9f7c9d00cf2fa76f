import ctypes
import os

import pytest

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
PRIVATE_DIRS = ("/var/lib/cni", "/var/run/cni", "/run/cni")  # libcni's cache, host-local's default and Nomad's dirs


def _mount(libc, source: str, target: str, fstype: str, flags: int) -> None:
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags, None) != 0:
        pytest.fail(f"mount {target}: {os.strerror(ctypes.get_errno())}")


@pytest.fixture(scope="module")
def private_host():
    """Unit tests that call the verbs in process (verbs sweep) ask for this: for the module the process
    runs in a throwaway network namespace and a private mount namespace with empty tmpfs over libcni's and
    host-local's default directories, so that nothing they do reaches the machine's tables or state. The
    pure unit tests do not ask for it and run without root."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the verbs run in a private network and mount namespace)")
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    home_mnt = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    cwd = os.getcwd()
    if libc.unshare(CLONE_NEWNET | CLONE_NEWNS) != 0:
        pytest.fail(f"unshare failed: {os.strerror(ctypes.get_errno())}")
    _mount(libc, "none", "/", "", MS_REC | MS_PRIVATE)
    for d in PRIVATE_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            _mount(libc, "tmpfs", d, "tmpfs", 0)
    try:
        yield
    finally:
        if libc.setns(home, CLONE_NEWNET) != 0 or libc.setns(home_mnt, CLONE_NEWNS) != 0:
            pytest.exit("could not return to the original network and mount namespaces", returncode=3)
        os.chdir(cwd)
        os.close(home)
        os.close(home_mnt)
