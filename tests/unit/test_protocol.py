"""The CNI protocol shell: verbs, versions, env and config validation, error JSON."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers import NETNS, conf, invoke, prev_result

from cni_reaper import versions


def test_version_lists_every_supported_version():
    rc, out = invoke("VERSION", b"")
    assert rc == 0
    assert out == {"cniVersion": "1.1.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_add_passes_prev_result_through_unchanged_in_every_version(tmp_path, version):
    prev = prev_result(version)
    rc, out = invoke("ADD", conf(tmp_path / "s", version, prev))
    assert rc == 0
    assert out == prev


def test_add_without_prev_result_says_it_must_be_chained(tmp_path):
    rc, out = invoke("ADD", conf(tmp_path / "s", prev=None))
    assert rc == 1 and out["code"] == 7
    assert "chained" in out["msg"] and "bridge" in out["details"]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("prev", [
    {"ips": "172.26.64.2/20"},
    {"ips": [{"address": "not-an-ip/20"}]},
    {"ips": [{"address": "172.26.64.2"}]},
    {"ips": [{"address": "172.26.64.2/20", "version": "6"}]},
    {"ips": [{"address": "172.26.64.2/20", "interface": 5}], "interfaces": []},
    {"interfaces": [{"mac": "x"}]},
])
def test_prev_result_of_wrong_shape_is_invalid_config(tmp_path, prev):
    rc, out = invoke("ADD", conf(tmp_path / "s", prev=prev))
    assert rc == 1 and out["code"] == 7 and out["msg"] == "prevResult is not a valid CNI result"
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("data,code", [
    (b"{not json", 6), (b"", 6), (b"[1,2]", 6), (b'"str"', 6), (b"{" * 100000, 6),
])
def test_undecodable_config_is_decode_failure(tmp_path, data, code):
    rc, out = invoke("ADD", data)
    assert rc == 1 and out["code"] == code and out["msg"]


@pytest.mark.parametrize("field,value,code", [
    ("cniVersion", "9.9.9", 1), ("cniVersion", "0.2.0", 1), ("cniVersion", "abc", 6), ("cniVersion", 1, 6),
    ("backend", "iptables", 7), ("stateDir", "relative/dir", 7), ("name", "../etc", 7), ("name", "", 7),
    ("runtimeConfig", {"portMappings": [{"hostPort": 70000, "containerPort": 80}]}, 7),
    ("lockTimeout", -1, 7),
])
def test_bad_config_values_get_the_spec_code(tmp_path, field, value, code):
    c = conf(tmp_path / "s")
    c[field] = value
    rc, out = invoke("ADD", c)
    assert rc == 1 and out["code"] == code, out
    assert not (tmp_path / "s").exists()


def test_missing_cni_version_is_treated_as_0_1_0_and_refused(tmp_path):
    c = conf(tmp_path / "s")
    del c["cniVersion"]
    rc, out = invoke("ADD", c)
    assert out["code"] == 1 and "0.1.0" in out["details"] and "1.1.0" in out["details"]


def test_cni_versions_list_is_honoured(tmp_path):
    c = conf(tmp_path / "s")
    del c["cniVersion"]
    c["cniVersions"] = ["0.2.0", "0.4.0", "1.0.0", "7.0.0"]
    rc, out = invoke("ADD", c)
    assert rc == 0 and out["cniVersion"] == "1.0.0"
    c["cniVersions"] = ["0.1.0", "0.2.0"]
    rc, out = invoke("ADD", c)
    assert rc == 1 and out["code"] == 1


@pytest.mark.parametrize("verb,old", [("CHECK", "0.3.1"), ("GC", "1.0.0"), ("STATUS", "1.0.0")])
def test_verbs_need_their_minimum_version(tmp_path, verb, old):
    rc, out = invoke(verb, conf(tmp_path / "s", old))
    assert rc == 1 and out["code"] == 1 and f"does not allow {verb}" in out["msg"]


@pytest.mark.parametrize("env,code", [
    ({"CNI_CONTAINERID": "../../etc"}, 4),
    ({"CNI_CONTAINERID": "a/b"}, 4),
    ({"CNI_CONTAINERID": "a\nb"}, 4),
    ({"CNI_CONTAINERID": "-x"}, 4),
    ({"CNI_CONTAINERID": None}, 3),
    ({"CNI_IFNAME": "e" * 16}, 4),
    ({"CNI_IFNAME": ".."}, 4),
    ({"CNI_IFNAME": "eth 0"}, 4),
    ({"CNI_IFNAME": "eth:0"}, 4),
    ({"CNI_IFNAME": None}, 4),
    ({"CNI_NETNS": None}, 4),
    ({"CNI_PATH": None}, 4),
    ({"CNI_COMMAND": "FROB"}, 4),
])
def test_bad_environment_is_refused_before_anything_is_written(tmp_path, env, code):
    rc, out = invoke(env.pop("CNI_COMMAND", "ADD"), conf(tmp_path / "s"), **{
        "cid" if k == "CNI_CONTAINERID" else "ifname" if k == "CNI_IFNAME" else "netns" if k == "CNI_NETNS" else k: v
        for k, v in env.items()})
    assert rc == 1 and out["code"] == code, out
    assert out["cniVersion"] == "1.0.0"
    assert not (tmp_path / "s").exists()


def test_ifname_of_15_chars_is_fine(tmp_path):
    rc, _ = invoke("ADD", conf(tmp_path / "s"), ifname="e" * 15)
    assert rc == 0


def test_del_needs_no_netns_no_prev_result_and_no_record(tmp_path):
    rc, out = invoke("DEL", conf(tmp_path / "s", prev=None), netns=None)
    assert rc == 0 and out is None
    rc, out = invoke("DEL", conf(tmp_path / "s", prev=None), netns="")
    assert rc == 0


def test_go_style_port_mapping_keys_are_accepted(tmp_path):
    """go-cni (Nomad, containerd) sends untagged Go struct fields; Go plugins decode them case-insensitively."""
    c = conf(tmp_path / "s", runtimeConfig={"portMappings": [
        {"HostPort": 8080, "ContainerPort": 80, "Protocol": "TCP", "HostIP": ""}]})
    rc, _ = invoke("ADD", c)
    assert rc == 0


def test_run_without_command_prints_about_to_stderr(package_exe):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    proc = subprocess.run([package_exe], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == ""
    assert "cni-reaper" in proc.stderr and "1.1.0" in proc.stderr


def test_errors_from_the_real_executable_are_json_without_traceback(package_exe, tmp_path):
    env = dict(os.environ, CNI_COMMAND="ADD", CNI_CONTAINERID="x", CNI_NETNS=NETNS, CNI_IFNAME="eth0", CNI_PATH="/")
    proc = subprocess.run([package_exe], env=env, input=b"{]", capture_output=True)
    assert proc.returncode == 1
    assert b"Traceback" not in proc.stderr + proc.stdout
    assert proc.stdout.startswith(b'{"cniVersion"') and b'"code": 6' in proc.stdout
