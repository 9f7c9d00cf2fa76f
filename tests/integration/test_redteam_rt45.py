"""Red team rt45: the bundle's code index (build/codeindex.py, build/entry.py, scripts/bundle.py).

The promise attacked: the bundle behaves exactly as before, only faster; any damage to cni-reaper.lib/code.index
degrades to the old behaviour (every module from its own .pyc), never to a traceback, a wrong answer or a stall
of an ADD/CHECK/DEL/STATUS.

Each test copies the built bundle (dist/cni-reaper, or CNI_REAPER_BIN) to tmp_path, damages the copy's index,
and runs one ADD in a network namespace of its own (`unshare -n`, gone with the call). The same ADD with the
index removed (the old behaviour, which the change promises to fall back to) answers in every case; the
reference run is part of each test.
"""

from __future__ import annotations

import json
import marshal
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.sandbox import binary_exe

MAGIC = b"cni-reaper code index 1\n"
INDEX = "cni-reaper.lib/code.index"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for unshare -n")


def _copy(tmp_path: Path, name: str) -> Path:
    exe = binary_exe()
    dst = tmp_path / name
    shutil.copytree(os.path.dirname(exe), dst, symlinks=True)
    return dst / os.path.basename(exe)


def _table(index: Path) -> tuple[bytearray, int, dict]:
    data = bytearray(index.read_bytes())
    n = int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "little")
    return data, n, marshal.loads(bytes(data[len(MAGIC) + 8:len(MAGIC) + 8 + n]))


def _add(tmp_path: Path, exe: Path, cid: str, preexec=None, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid,
           "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"}
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "cni-reaper", "stateDir": str(tmp_path / "s"),
            "logFile": "", "cniCacheDir": str(tmp_path / "cache"), "ipamDataDir": str(tmp_path / "ipam"),
            "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.9.0.2/24"}]}}
    return subprocess.run(["unshare", "-n", str(exe)], env=env, input=json.dumps(conf), capture_output=True,
                          text=True, preexec_fn=preexec, timeout=timeout)


def _answers(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert json.loads(proc.stdout)["ips"] == [{"address": "10.9.0.2/24"}]


def _old_behaviour_answers(tmp_path: Path, preexec=None) -> None:
    """The reference: the same call with no index at all (every module from its .pyc, as before the change)."""
    exe = _copy(tmp_path, "no-index")
    os.unlink(exe.parent / INDEX)
    _answers(_add(tmp_path, exe, "ref", preexec))


def test_a_fifo_in_place_of_the_index_stalls_every_call_forever(tmp_path):
    """BREAK (stall). Promise: damage to code.index never stalls an ADD/CHECK/DEL/STATUS.
    Reproduce: `rm cni-reaper.lib/code.index; mkfifo cni-reaper.lib/code.index`; any run of the bundle (an ADD,
    `cni-reaper version`) blocks forever in build/codeindex.py `_open` (os.open of a FIFO with O_RDONLY and no
    O_NONBLOCK waits for a writer), before any of cni-reaper runs. Before the change the bundle never opened
    that name. Fix: O_NONBLOCK on the open and an fstat S_ISREG check before reading."""
    _old_behaviour_answers(tmp_path)
    exe = _copy(tmp_path, "fifo")
    index = exe.parent / INDEX
    os.unlink(index)
    os.mkfifo(index)
    try:
        proc = _add(tmp_path, exe, "fifo", timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("ADD stalled: the bundle blocks opening a FIFO at cni-reaper.lib/code.index")
    _answers(proc)


def test_a_module_body_that_unmarshals_to_no_code_is_a_traceback(tmp_path):
    """BREAK (traceback instead of the old behaviour). Promise: a damaged index falls back to the .pyc files.
    Reproduce: in code.index, change the first byte of cni_reaper.cni.shell's code to b"N" (marshal's None; a torn
    or in-place rewritten index, e.g. `cp -r` of a new release over a bundle while a call runs, hands pread
    bytes from the middle of another module, which unmarshal to a str, a tuple, None as readily as they fail).
    build/codeindex.py exec_module (line ~66-70) only guards marshal.loads: exec(None) raises TypeError outside
    the try, and the ADD dies with a Python traceback (PyInstaller's 'Failed to execute script'), no CNI answer.
    A body that unmarshals to a str is even compiled and run as source. Fix: check `type(code) is CodeType`
    inside the try, and fall back to the .pyc otherwise."""
    _old_behaviour_answers(tmp_path)
    exe = _copy(tmp_path, "none-body")
    index = exe.parent / INDEX
    data, _, table = _table(index)
    offset, _, _ = table["cni_reaper.cni.shell"]
    data[offset + len(b"cni_reaper.cni.shell\0")] = ord("N")  # its code, after the name that heads the body
    index.write_bytes(bytes(data))
    _answers(_add(tmp_path, exe, "none-body"))


def test_a_malformed_table_entry_is_a_traceback(tmp_path):
    """BREAK (traceback). Promise: a damaged index falls back to the .pyc files. Reproduce: rewrite code.index's
    table (still a marshalled dict, as `_open` checks) with cni_reaper.cni.shell's entry cut to (offset, size).
    build/codeindex.py find_spec (line ~48, `entry[2]`) raises IndexError, not caught anywhere (nor would
    exec_module's unpacking `offset, size, _ = ...`, which is outside its try): the ADD dies with a traceback.
    `_open` checks only `type(table) is dict`, not the shape of its entries. Fix: validate every entry (str ->
    (int >= 0, int >= 0, bool)) in `_open`, or treat any exception of find_spec/exec_module as 'not held'."""
    _old_behaviour_answers(tmp_path)
    exe = _copy(tmp_path, "bad-entry")
    index = exe.parent / INDEX
    data, n, table = _table(index)
    table["cni_reaper.cni.shell"] = table["cni_reaper.cni.shell"][:2]
    raw = marshal.dumps(table, 4)
    assert len(raw) <= n
    data[len(MAGIC) + 8:len(MAGIC) + 8 + n] = raw + b"\0" * (n - len(raw))
    index.write_bytes(bytes(data))
    _answers(_add(tmp_path, exe, "bad-entry"))


def test_a_damaged_table_length_under_an_address_space_limit_is_a_memoryerror(tmp_path):
    """BREAK (traceback). Promise: a damaged index degrades to the old behaviour. Reproduce: set the 4-byte
    table length of code.index (bytes 24-27) to 0xfffffff0 and run an ADD under `ulimit -v 1048576` (1 GiB of
    address space, under which the old bundle answers). build/codeindex.py `_open` (line ~104) calls
    os.pread(fd, n, ...) with n from the file unchecked: Python allocates n bytes first, MemoryError is not
    in the caught tuple, and the bundle dies in entry.py with a traceback before cni-reaper runs. Same for a
    huge `size` of a table entry in exec_module. Fix: bound n (and size) by fstat's st_size before reading."""
    limit = 1 << 30

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    _old_behaviour_answers(tmp_path, preexec)
    exe = _copy(tmp_path, "huge-length")
    index = exe.parent / INDEX
    data = bytearray(index.read_bytes())
    data[len(MAGIC):len(MAGIC) + 4] = (0xFFFFFFF0).to_bytes(4, "little")
    index.write_bytes(bytes(data))
    _answers(_add(tmp_path, exe, "huge-length", preexec))


def test_the_index_keeps_one_more_descriptor_open_for_the_whole_call(tmp_path):
    """BREAK (minor; traceback where the old bundle answered). Promise: the bundle behaves exactly as before.
    Reproduce: run an ADD with RLIMIT_NOFILE 4 (`ulimit -n 4`). The old bundle answers (rc 0, its lock failure
    a CNI warning); the new one holds code.index open (fd 3) for the whole process (build/codeindex.py
    install/`_open`), so the next extension module's dlopen (_json) fails with EMFILE and the ADD dies with a
    traceback. Contrived limit; it shows the index costs a descriptor for the process's life."""

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4, 4))

    _old_behaviour_answers(tmp_path, preexec)
    _answers(_add(tmp_path, _copy(tmp_path, "nofile"), "nofile", preexec))


@pytest.mark.parametrize("damage", ["directory", "empty", "zeroed-middle", "chmod-000", "dev-zero", "no-pyc"])
def test_held_damage_that_falls_back(tmp_path, damage):
    """HELD: a directory, an empty file, 200 KB of zeros in the middle (a torn write), mode 000 (as root),
    a symlink to /dev/zero in place of code.index, and a module held by the index whose .pyc is gone: the ADD
    answers as before."""
    exe = _copy(tmp_path, damage)
    index = exe.parent / INDEX
    if damage == "directory":
        os.unlink(index)
        index.mkdir()
    elif damage == "empty":
        index.write_bytes(b"")
    elif damage == "zeroed-middle":
        data = bytearray(index.read_bytes())
        data[200_000:400_000] = bytes(200_000)
        index.write_bytes(bytes(data))
    elif damage == "chmod-000":
        index.chmod(0)
    elif damage == "dev-zero":
        os.unlink(index)
        index.symlink_to("/dev/zero")
    else:
        os.unlink(exe.parent / "cni-reaper.lib" / "cni_reaper" / "cni" / "shell.pyc")
    _answers(_add(tmp_path, exe, damage))
