"""The verbs on the start and stop path of every allocation stay light: with nothing stale they import
neither pydantic nor the netfilter machinery nor a subprocess, and a finished DEL's tombstone is dropped
without reading the tables. (Timing is measured by scripts/bench.sh, never asserted here.)"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from testkit.cni import NETNS, conf, prev_result

pytestmark = pytest.mark.usefixtures("private_host")  # verbs in process: a throwaway netns and mount ns

HEAVY = ("pydantic", "pydantic_core", "pyroute2", "iptc", "ipaddress", "subprocess", "datetime", "hashlib",
         "cni_reaper.reap.cleanup", "cni_reaper.reap.netfilter", "cni_reaper.models", "cni_reaper.reap.conntrack",
         "socket", "re", "json", "enum", "typing", "dataclasses", "inspect", "contextlib", "argparse", "selectors",
         "threading", "signal", "functools", "collections", "_hashlib",
         # the readers of who else maps a host port: an ADD's look, after its answer (0.4 ms to import)
         "cni_reaper.reap.holders")

PROBE = """
import io, sys
env, heavy_names = eval(sys.argv[1]), eval(sys.argv[3])  # literals: the probe imports nothing of its own
before = set(sys.modules)
from cni_reaper.cni import afterwards, shell
from cni_reaper.verbs.dispatch import dispatch
if len(sys.argv) > 4:  # as the entry point runs a CNI call: work for after the answer is kept, not done
    afterwards.enable()
out = io.StringIO()
rc = shell.run(env, io.BytesIO(sys.argv[2].encode()), out, dispatch)
heavy = sorted({m.split(".")[0] if not m.startswith("cni_reaper") else m for m in set(sys.modules) - before
                if m.startswith(heavy_names)})
print(repr({"rc": rc, "heavy": heavy}))
"""


def run_verb(command, config, cid="alloc-1", netns=NETNS, as_entry_point=False):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": "/x"}
    flag = ["entry point"] if as_entry_point else []
    proc = subprocess.run([sys.executable, "-c", PROBE, repr(env), json.dumps(config), repr(HEAVY), *flag],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr
    return ast.literal_eval(proc.stdout.splitlines()[-1])


# what an ADD that maps host ports imports to read who else maps them (reap/orphans.shadowing): the readers of
# the hostport chains, run as tools; never the clean-up, python-iptables, pydantic or pyroute2
PORTS_READ = ("cni_reaper.reap.netfilter", "cni_reaper.reap.orphans", "cni_reaper.reap.holders", "subprocess",
              "signal", "selectors", "threading", "contextlib", "enum", "functools", "collections", "re", "json")


def test_add_del_status_with_nothing_stale_import_nothing_heavy(tmp_path):
    state = tmp_path / "s"
    ports = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
    for i in range(3):  # other live attachments
        assert run_verb("ADD", conf(state, prev=prev_result(address=f"172.26.64.{i + 5}/20")),
                        cid=f"other-{i}") == {"rc": 0, "heavy": []}
    # a CNI call's ADD answers before its look at who else maps its host ports (cni/afterwards.py)
    assert run_verb("ADD", conf(state, runtimeConfig=ports), cid="answered", as_entry_point=True) == {
        "rc": 0, "heavy": []}
    add = run_verb("ADD", conf(state, runtimeConfig=ports))  # in process, the look is done at once
    assert add["rc"] == 0 and add["heavy"], "an ADD with ports reads the hostport chains"
    assert [m for m in add["heavy"] if not m.startswith(PORTS_READ)] == [], add["heavy"]
    # libcni caches the attachment once the chain's ADD is done, and deletes it once the chain's DEL is
    cached = tmp_path / "cache" / "results" / "nomad-reaper-alloc-1-eth0"
    cached.parent.mkdir(parents=True)
    cached.write_text('{"kind": "cniCacheV1"}')
    assert run_verb("DEL", conf(state, runtimeConfig=ports)) == {"rc": 0, "heavy": []}
    cached.unlink()
    status = run_verb("STATUS", conf(state, "1.1.0", prev=None))
    assert status == {"rc": 0, "heavy": []}
    # the finished DEL's tombstone went without a look at the tables
    names = {json.loads(p.read_text())["containerID"] for p in state.glob("r-*.json")}
    assert names == {"other-0", "other-1", "other-2", "answered"}


def test_a_del_that_must_clean_does_load_the_machinery(tmp_path):
    """The converse, so that the test above can fail: a dead attachment makes the sweep do real work."""
    state = tmp_path / "s"
    assert run_verb("ADD", conf(state))["rc"] == 0
    dead = run_verb("DEL", conf(state), netns="/var/run/netns/gone-for-good")
    assert dead["rc"] == 0 and "cni_reaper.reap.cleanup" in dead["heavy"]
    # and even then nothing for the classes' or the types' sake: dataclasses (with inspect, ast, tokenize),
    # typing and json cost a cleaning call ~12 ms of imports (cni_reaper/values.py); nor for running the
    # tools (subprocess: signal, enum, threading, selectors, contextlib), the chains' names (hashlib: OpenSSL),
    # conntrack's netlink socket (socket: selectors, enum) or a lock (contextlib: collections, functools):
    # another ~18 ms (Python 3.9)
    assert not {"dataclasses", "inspect", "typing", "json", "subprocess", "signal", "enum", "threading", "selectors",
                "contextlib", "hashlib", "_hashlib", "socket", "collections", "functools"} & set(dead["heavy"]), dead["heavy"]


WRAP_PROBE = """
import sys
heavy_names = eval(sys.argv[1])
before = set(sys.modules)
sys.argv = [sys.argv[2]]  # run as the wrapper link
from cni_reaper.wrap.wrapper import main
rc = main("portmap")
heavy = sorted({m.split(".")[0] if not m.startswith("cni_reaper") else m for m in set(sys.modules) - before
                if m.startswith(heavy_names)})
sys.stdout.write("\\n" + repr({"rc": rc, "heavy": heavy}) + "\\n")
"""


@pytest.mark.parametrize("command", ["", "VERSION", "ADD"])
def test_the_wrapper_imports_nothing_heavy_around_the_real_plugin(tmp_path, command):
    """The fingerprint, VERSION and an ADD through the wrapper (the real plugin a stand-in that answers): the
    wrapper's own imports (its timer's signal module included) stay as light as a chained call's."""
    real = tmp_path / "plugins" / "portmap"
    real.parent.mkdir()
    real.write_text('#!/bin/sh\ncat >/dev/null\necho \'{"cniVersion": "0.4.0", "ips": []}\'\n')
    real.chmod(0o755)
    link = tmp_path / "wrap" / "portmap"
    link.parent.mkdir()
    link.symlink_to(sys.executable)  # any file other than the real one: the wrapper is judged by identity
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"stateDir": str(tmp_path / "s"), "logFile": "", "cniCacheDir": str(tmp_path / "c"),
                                    "ipamDataDir": str(tmp_path / "i")}))
    env = {"CNI_PATH": f"{link.parent}:{real.parent}", "CNI_REAPER_CONFIG": str(settings), "CNI_CONTAINERID": "alloc-1",
           "CNI_NETNS": NETNS, "CNI_IFNAME": "eth0", "PYTHONPATH": os.pathsep.join(sys.path)}
    if command:
        env["CNI_COMMAND"] = command
    stdin = json.dumps({**conf(tmp_path / "s", runtimeConfig={"portMappings": []}), "type": "portmap"})
    proc = subprocess.run([sys.executable, "-c", WRAP_PROBE, repr(HEAVY), str(link)], input=stdin,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert ast.literal_eval(proc.stdout.splitlines()[-1]) == {"rc": 0, "heavy": []}, proc.stdout


CLI_PROBE = """
import contextlib, io, sys
from cni_reaper.tools.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    rc = main(sys.argv[1:])
print(repr({"rc": rc, "pydantic": "pydantic" in sys.modules, "core": "pydantic_core" in sys.modules}))
"""


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_the_commands_load_pydantic_core_only_to_print_a_json_document(tmp_path, json_flag):
    """The timer's `sweep` and an operator's `list` start without pydantic: a --json document is checked by its
    model's generated core schema (tools/printed.py, tools/output_checks.py), which loads pydantic-core alone;
    pydantic, its models and their schemas' building are about 70 ms of a bundle's start."""
    state = tmp_path / "s"
    assert run_verb("ADD", conf(state), cid="one")["rc"] == 0
    common = ["--state-dir", str(state), "--cni-conf-dir", str(tmp_path / "none")]
    for argv in (["list", *json_flag, *common], ["sweep", *json_flag, *common, "--log-file", str(tmp_path / "log")]):
        proc = subprocess.run([sys.executable, "-c", CLI_PROBE, *argv], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert proc.returncode == 0, proc.stderr
        got = ast.literal_eval(proc.stdout.splitlines()[-1])
        assert got == {"rc": got["rc"], "pydantic": False, "core": bool(json_flag)}, (argv, got)
