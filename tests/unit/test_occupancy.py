"""netns.Occupancy, the one look at who holds network namespaces (reap/word.py), against this process's
own /proc: a thread that entered a namespace, a descriptor of one, and a descriptor it must never stat (a file
on a FUSE mount that does not answer would hold the sweep: only descriptors that read as a namespace or as a
file in a netns directory looked at are)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading

import pytest

from cni_reaper.reap import netns

pytestmark = pytest.mark.netns


@pytest.fixture
def namespace(private_host, tmp_path):
    """A network namespace pinned at <tmp>/ns/pinned, mounted in the module's private mount namespace."""
    d = tmp_path / "ns"
    d.mkdir()
    path = d / "pinned"
    path.touch()
    subprocess.run(["unshare", f"--net={path}", "true"], check=True)
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", str(path)], check=False)


def ident(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_a_descriptor_through_the_mount_is_seen_and_no_other_file_is_looked_at(namespace, tmp_path, monkeypatch):
    other = tmp_path / "elsewhere"
    other.write_text("x")
    fd, stranger = os.open(namespace, os.O_RDONLY), os.open(other, os.O_RDONLY)
    looked: list[str] = []
    real = os.stat

    def stat(path, *a, **kw):
        looked.append(str(path))
        return real(path, *a, **kw)

    try:
        monkeypatch.setattr(netns.os, "stat", stat)
        occ = netns.Occupancy(frozenset({os.path.dirname(os.path.realpath(namespace))}))
        monkeypatch.undo()
        assert occ.held_otherwise(ident(namespace), namespace) == f"process {os.getpid()} holds a descriptor of it"
        assert f"/proc/{os.getpid()}/fd/{stranger}" not in looked
        assert occ.process_in(ident(namespace)) is None
        assert netns.Occupancy().held_otherwise(ident(namespace), namespace) is None  # its directory not looked at
    finally:
        os.close(fd)
        os.close(stranger)


def test_a_thread_that_entered_the_namespace_is_in_it(namespace):
    libc = ctypes.CDLL(None, use_errno=True)
    entered, leave = threading.Event(), threading.Event()

    def inside():
        fd = os.open(namespace, os.O_RDONLY)
        assert libc.setns(fd, 0x40000000) == 0, ctypes.get_errno()
        os.close(fd)
        entered.set()
        leave.wait(30)

    t = threading.Thread(target=inside, daemon=True)  # a thread in another netns ends with the test process
    t.start()
    assert entered.wait(10)
    try:
        assert netns.Occupancy().process_in(ident(namespace)) == os.getpid()
    finally:
        leave.set()


def test_a_mount_at_another_path_holds_the_namespace(namespace, tmp_path):
    """Its only mount goes with the unlink (in every mount namespace: the kernel detaches each mount on an
    unlinked file); a second mount at another path would keep it, its interface and its address alive."""
    assert netns.Occupancy().held_otherwise(ident(namespace), namespace) is None
    second = tmp_path / "second"
    second.touch()
    subprocess.run(["mount", "--bind", namespace, str(second)], check=True)
    try:
        said = netns.Occupancy().held_otherwise(ident(namespace), namespace)
        assert said == f"it is mounted at {second} too", said
    finally:
        subprocess.run(["umount", str(second)], check=False)
