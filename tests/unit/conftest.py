import ctypes
import os

import pytest

CLONE_NEWNET = 0x40000000


@pytest.fixture(scope="session", autouse=True)
def private_netns():
    """Unit tests call the verbs in process, and verbs sweep: run this process in a throwaway network
    namespace for their duration, so that nothing they do can reach the machine's own tables."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the verbs run in a private network namespace)")
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    if libc.unshare(CLONE_NEWNET) != 0:
        pytest.fail(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        if libc.setns(home, CLONE_NEWNET) != 0:
            pytest.exit("could not return to the original network namespace", returncode=3)
        os.close(home)
