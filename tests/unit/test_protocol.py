"""The CNI protocol shell: verbs, versions, env and config validation, error JSON."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from cni_reaper.cni import versions
from testkit.cni import NETNS, conf, invoke, prev_result

pytestmark = pytest.mark.usefixtures("private_host")  # verbs in process: a throwaway netns and mount ns


def test_version_lists_every_supported_version():
    rc, out = invoke("VERSION", b"")
    assert rc == 0
    assert out == {"cniVersion": "1.1.0",
                   "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}


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
    {"ips": [{"address": "172.26.64.2/33"}]},
    {"ips": [{"address": "fe80::1%eth0/64"}]},
    {"ips": [{"address": 17}]},
    {"ips": [{"address": "172.26.64.2/20", "gateway": "172.26.64.256"}]},
    {"ips": [{"address": "172.26.64.2/20", "interface": "2"}]},
    {"ips": ["172.26.64.2/20"]},
    {"interfaces": [{"name": 5}]},
    {"interfaces": "eth0"},
])
def test_prev_result_that_go_refuses_is_invalid_config(tmp_path, prev):
    """What libcni's result types refuse to decode (so portmap and firewall fail on it too)."""
    rc, out = invoke("ADD", conf(tmp_path / "s", prev=prev))
    assert rc == 1 and out["code"] == 7 and out["msg"] == "prevResult is not a valid CNI result"
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("prev,recorded", [
    ({"ips": [{"address": "172.26.64.2/20", "version": "6"}]}, ["172.26.64.2/20"]),
    ({"ips": [{"address": "172.26.64.2/20", "interface": 5}], "interfaces": []}, ["172.26.64.2/20"]),
    ({"ips": [{"address": "172.26.64.2/20", "interface": -1}]}, ["172.26.64.2/20"]),
    ({"interfaces": [{"mac": "x"}, None], "ips": [None, {"address": "172.26.64.2/020"}]}, ["172.26.64.2/20"]),
    ({"IPs": [{"Address": "172.26.64.2/20", "GateWay": None, "Interface": None}], "Interfaces": None},
     ["172.26.64.2/20"]),
    ({"ips": [{"gateway": "172.26.64.1"}]}, []),
    ({"ips": None, "dns": None, "routes": None}, []),
    ({"cniVersion": "0.2.0", "ip4": {"ip": "172.26.64.2/20", "gateway": "172.26.64.1"}, "ip6": {"ip": "fd00::2/64"}},
     ["172.26.64.2/20", "fd00::2/64"]),
])
def test_prev_result_that_go_accepts_is_recorded(tmp_path, prev, recorded):
    """Nulls, any key case, missing names, indexes out of range, a mismatched `version`: Go's result types
    accept all of it, so cni-reaper records what addresses there are and passes the result through."""
    rc, out = invoke("ADD", conf(tmp_path / "s", prev=prev))
    assert rc == 0 and out == dict(prev, cniVersion=prev.get("cniVersion", "1.0.0"))
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "s").glob("r-*.json")]
    assert [f"{ip['address']}/{ip['prefix']}" for ip in record["current"]["ips"]] == recorded


@pytest.mark.parametrize("data,code", [
    (b"{not json", 6), (b"", 6), (b"[1,2]", 6), (b'"str"', 6), (b"{" * 100000, 6),
])
def test_undecodable_config_is_decode_failure(tmp_path, data, code):
    rc, out = invoke("ADD", data)
    assert rc == 1 and out["code"] == code and out["msg"]


@pytest.mark.parametrize("field,value,code", [
    ("cniVersion", "9.9.9", 1), ("cniVersion", "1.2.0", 1), ("cniVersion", "abc", 6), ("cniVersion", 1, 6),
    ("stateDir", "relative/dir", 7), ("stateDir", 5, 7), ("name", "../etc", 7), ("name", "", 7), ("name", None, 7),
])
def test_the_errors_that_remain_by_design_get_the_spec_code(tmp_path, field, value, code):
    """A version nobody speaks, a network name libcni would refuse, a state directory that cannot hold
    records: the few ADD errors left (docs/how-it-works.md, "Never block an allocation")."""
    c = conf(tmp_path / "s")
    c[field] = value
    rc, out = invoke("ADD", c)
    assert rc == 1 and out["code"] == code, out
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("field,value,warning", [
    ("backend", "iptables", "backend 'iptables'"), ("lockTimeout", -1, "lockTimeout -1"),
    ("lockTimeout", "10", "lockTimeout '10'"), ("ipamDataDir", "relative", "ipamDataDir must be an absolute path"),
    ("cniCacheDir", 7, "cniCacheDir must be a string"),
    ("runtimeConfig", {"portMappings": [{"hostPort": 70000, "containerPort": 80}]}, "portMappings.0 skipped"),
    ("runtimeConfig", {"portMappings": [{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]}, "protocol"),
    ("runtimeConfig", {"portMappings": "8080"}, "not a list"),
    ("runtimeConfig", "ports", "runtimeConfig is not an object"),
])
def test_an_unusable_value_of_cni_reapers_own_keys_is_a_warning_not_a_failure(tmp_path, capfd, field, value,
                                                                              warning):
    c = conf(tmp_path / "s")
    c[field] = value
    rc, out = invoke("ADD", c)
    assert rc == 0 and out == c["prevResult"]
    assert warning in capfd.readouterr().err
    assert invoke("CHECK", c)[0] == 0 and invoke("DEL", c)[0] == 0


def test_del_goes_on_whatever_its_config_says(tmp_path):
    """DEL must succeed when the reference plugins' DEL would: not even an unusable stateDir or a prevResult
    of the wrong type fails it."""
    for field, value in (("stateDir", "relative"), ("prevResult", "x"), ("prevResult", [1]),
                         ("runtimeConfig", {"portMappings": [None, 5]})):
        c = conf(tmp_path / "s")
        c[field] = value
        rc, out = invoke("DEL", c)
        assert rc == 0 and out is None, (field, value, out)


def test_missing_cni_version_is_treated_as_0_1_0_as_skel_does(tmp_path):
    c = conf(tmp_path / "s", prev={"ip4": {"ip": "172.26.64.2/20"}})
    del c["cniVersion"]
    rc, out = invoke("ADD", c)
    assert rc == 0 and out["cniVersion"] == "0.1.0"
    assert invoke("CHECK", c)[1]["code"] == 1  # CHECK needs 0.4.0


def test_cni_versions_list_is_honoured(tmp_path):
    c = conf(tmp_path / "s")
    del c["cniVersion"]
    c["cniVersions"] = ["0.2.0", "0.4.0", "1.0.0", "7.0.0"]
    rc, out = invoke("ADD", c)
    assert rc == 0 and out["cniVersion"] == "1.0.0"
    c["cniVersions"] = ["7.0.0", "8.0.0"]
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
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "s").glob("r-*.json")]
    assert record["current"]["portMappings"] == [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""}]


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
    assert json.loads(proc.stdout)["code"] == 6 and proc.stdout.startswith(b'{"cniVersion"')


def test_without_the_capability_add_records_no_ports_and_says_how_to_fix_it(tmp_path, capfd):
    c = conf(tmp_path / "s")
    assert "capabilities" not in c
    rc, _ = invoke("ADD", c)
    assert rc == 0
    [line] = [json.loads(l) for l in capfd.readouterr().err.splitlines() if "capability" in l]
    assert line["level"] == "warning" and '"capabilities": {"portMappings": true}' in line["fix"]
    c["capabilities"] = {"portMappings": True}
    c["runtimeConfig"] = {"portMappings": [{"hostPort": 8080, "containerPort": 80}]}
    assert invoke("ADD", c)[0] == 0
    assert "capability" not in capfd.readouterr().err
