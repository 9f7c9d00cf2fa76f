"""The PyInstaller bundle stands alone: no Python on the host, invoked through a symlink."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from testkit.sandbox import binary_exe


def _hidden_python_dirs() -> list[str]:
    """Every place a Python installation could be found on this machine."""
    dirs = []
    for root in ("/usr/lib", "/usr/local/lib", "/usr/lib64"):
        if os.path.isdir(root):
            dirs += [os.path.join(root, n) for n in os.listdir(root) if n.startswith("python3")]
    for extra in ("/root/.pyenv", "/opt/pyenv", os.path.dirname(os.path.dirname(os.path.realpath(os.__file__)))):
        if os.path.isdir(extra):
            dirs.append(extra)
    dirs = sorted(set(dirs))
    return [d for d in dirs if not any(d != o and d.startswith(o + "/") for o in dirs)]


def test_bundle_runs_with_every_python_hidden_and_through_a_symlink(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    exe = binary_exe()
    link = tmp_path / "bin" / "cni-reaper"
    link.parent.mkdir()
    link.symlink_to(exe)
    hide = " && ".join(f"mount -t tmpfs none {d}" for d in _hidden_python_dirs())
    script = (f"{hide} && ! python3 -c pass 2>/dev/null && ! /usr/bin/python3 -c pass 2>/dev/null && "
              f'exec "{link}"')
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "x",
           "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0", "CNI_PATH": str(link.parent)}
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "cni-reaper", "stateDir": str(tmp_path / "s"), "logFile": "",
            "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.9.0.2/24"}]}}
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env,
                          input=json.dumps(conf), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert json.loads(proc.stdout)["ips"] == [{"address": "10.9.0.2/24"}]
    assert len(list((tmp_path / "s").glob("r-*.json"))) == 1


def test_the_bundle_imports_every_module_of_a_call_from_its_code_index(tmp_path):
    """build/codeindex.py: a CNI call's modules come from the one index file, none from its own .pyc (each of
    those costs the call about 45 us more); and with the index damaged the call is as right as ever."""
    exe = binary_exe()
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "x",
           "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent", "CNI_REAPER_STAGES": "1"}
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "cni-reaper", "stateDir": str(tmp_path / "s"), "logFile": "",
            "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.9.0.2/24"}]}}

    def staged(exe_path: str) -> dict:
        # in a network namespace of its own, gone with it
        proc = subprocess.run(["unshare", "-n", exe_path], env=env, input=json.dumps(conf), capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert json.loads(proc.stdout)["ips"] == [{"address": "10.9.0.2/24"}]
        return next(json.loads(line)["stages"] for line in proc.stderr.splitlines() if line.startswith('{"stages"'))

    assert staged(exe)["from_files"] == []
    # a copy whose index is torn: every module from its own file, the answer the same
    copy = tmp_path / "bundle"
    shutil.copytree(os.path.dirname(exe), copy, symlinks=True)
    index = copy / "cni-reaper.lib" / "code.index"
    index.write_bytes(index.read_bytes()[:100])
    env["CNI_CONTAINERID"] = "y"
    files = staged(str(copy / os.path.basename(exe)))["from_files"]
    assert "cni_reaper.verbs.add" in files and "cni_reaper.main" in files
