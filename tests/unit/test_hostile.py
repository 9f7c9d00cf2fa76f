"""Hostile input (issue: reliability). Generated environments and stdin documents, in process: every answer
is a success or the spec's error JSON with a sensible code and a non-zero exit; never a traceback or an
internal error; nothing is written outside the state directory; a refused call changes nothing on disk.
A sample is replayed against the built binary. CNI_REAPER_HOSTILE_EXAMPLES sets the number of cases
(10,000 by default, as in CI)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cni_reaper.cni import shell
from cni_reaper.verbs.dispatch import dispatch
from testkit.cni import NETNS, prev_result
from testkit.sandbox import binary_exe

pytestmark = pytest.mark.usefixtures("private_host")  # verbs in process: a throwaway netns and mount ns

EXAMPLES = int(os.environ.get("CNI_REAPER_HOSTILE_EXAMPLES", "10000"))
SPEC_CODES = {1, 2, 3, 4, 5, 6, 7, 11, 50, 51}
ROOT = Path("/tmp/cni-reaper-hostile")

nasty_text = st.one_of(
    st.sampled_from(["", ".", "..", "../../etc", "a/b", "a\nb", "a\0b", "-x", "x" * 2000, "é", "🙂", "eth0", "e" * 16,
                     "e" * 15, "alloc-1", " ", "lo", "eth 0", "eth:0"]),
    st.text(max_size=40))
versions = st.one_of(st.sampled_from(["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.2.0", "9.9.9",
                                      "1.0", "01.0.0", "1.0.0-rc1", "", "١.٠.٠"]), st.integers(), st.none())
junk = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=10)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                    max_leaves=8)


@st.composite
def documents(draw, state_dir: str) -> bytes:
    kind = draw(st.sampled_from(["conf", "conf", "conf", "raw", "truncated", "nested"]))
    conf = {"cniVersion": draw(versions), "name": draw(st.one_of(st.just("nomad-reaper"), nasty_text)),
            "type": "cni-reaper", "stateDir": state_dir, "logFile": "",
            "prevResult": draw(st.one_of(st.just(prev_result()), st.just(prev_result("0.3.1")), junk)),
            "runtimeConfig": draw(st.one_of(st.just({"portMappings": [{"hostPort": 8080, "containerPort": 80}]}), junk)),
            "cni.dev/valid-attachments": draw(st.one_of(st.lists(st.fixed_dictionaries(
                {"containerID": nasty_text, "ifname": nasty_text}), max_size=3), junk))}
    if draw(st.booleans()):
        conf["cniVersions"] = draw(st.one_of(st.lists(versions, max_size=3), junk))
    for k in draw(st.lists(st.sampled_from(sorted(conf)), max_size=3, unique=True)):
        if k == "stateDir":
            continue  # writes must stay in the test's state dir; its handling is tested in test_state.py
        if draw(st.booleans()):
            del conf[k]
        else:
            conf[k] = draw(junk)
    text = json.dumps(conf)
    if kind == "raw":
        return draw(st.binary(max_size=200))
    if kind == "truncated":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))].encode()
    if kind == "nested":
        depth = draw(st.integers(1, 200000))
        return ("[" * depth + "]" * draw(st.integers(0, depth))).encode()
    return text.encode()


def tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p.relative_to(root))] = "dir" if p.is_dir() else "other"
    return out


@pytest.fixture(scope="module")
def sandbox_root():
    import shutil

    shutil.rmtree(ROOT, ignore_errors=True)
    (ROOT / "state").mkdir(parents=True)
    (ROOT / "elsewhere").mkdir()
    yield ROOT
    shutil.rmtree(ROOT, ignore_errors=True)


def check_answer(rc: int, out: str, command: str) -> None:
    assert "Traceback" not in out
    if rc == 0:
        if out:
            json.loads(out)
        return
    assert rc == 1
    err = json.loads(out)
    assert set(err) <= {"cniVersion", "code", "msg", "details"} and err["msg"]
    assert err["code"] in SPEC_CODES, err  # 999 would be an internal error: a bug


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@pytest.mark.slow
@given(data=st.data())
@example(data=None)
def test_hostile_env_and_stdin(sandbox_root, monkeypatch, data):
    monkeypatch.setattr("cni_reaper.cni.conf.DEFAULT_LOG_FILE", str(sandbox_root / "state" / "log"))
    monkeypatch.setattr("cni_reaper.cni.conf.DEFAULT_IPAM_DATA_DIR", str(sandbox_root / "state" / "ipam"))
    monkeypatch.setattr("cni_reaper.cni.conf.DEFAULT_CNI_CACHE_DIR", str(sandbox_root / "state" / "cache"))
    state = str(sandbox_root / "state" / "s")
    if data is None:  # an explicit 10 MB document
        command, env, stdin = "ADD", {"CNI_CONTAINERID": "x", "CNI_NETNS": NETNS, "CNI_IFNAME": "eth0"}, \
            json.dumps({"cniVersion": "1.0.0", "name": "n", "stateDir": state, "pad": "x" * (10 << 20)}).encode()
    else:
        command = data.draw(st.one_of(st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"]), nasty_text))
        env = {}
        for var in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"):
            if data.draw(st.integers(0, 4)):
                env[var] = data.draw(st.one_of(st.just({"CNI_CONTAINERID": "alloc-1", "CNI_NETNS": NETNS,
                                                        "CNI_IFNAME": "eth0", "CNI_ARGS": "IgnoreUnknown=1",
                                                        "CNI_PATH": "/opt/cni/bin"}[var]), nasty_text,
                                                st.just("/var/run/netns/hostile-" + var)))
        stdin = data.draw(documents(state))
    before = tree(sandbox_root)
    out = io.StringIO()
    rc = shell.run(dict(env, CNI_COMMAND=command), io.BytesIO(stdin), out, dispatch)
    check_answer(rc, out.getvalue(), command)
    after = tree(sandbox_root)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert all(k.startswith("state") for k in changed), changed
    if rc != 0:
        assert not {k for k in changed if not k.startswith("state/log")}, f"a refused call changed {changed}"
    assert not Path("/var/run/netns/hostile-CNI_NETNS").exists()


def test_a_sample_against_the_built_binary(sandbox_root):
    """The same kind of input, through the real executable (env and stdin as a runtime passes them)."""
    exe = binary_exe()
    state = str(sandbox_root / "state" / "bin")
    cases = [
        ("ADD", {"CNI_CONTAINERID": "../../etc", "CNI_NETNS": NETNS, "CNI_IFNAME": "eth0"}, b'{"cniVersion":"1.0.0","name":"n"}'),
        ("ADD", {"CNI_CONTAINERID": "a", "CNI_NETNS": NETNS, "CNI_IFNAME": "e" * 16}, b'{"cniVersion":"1.0.0","name":"n"}'),
        ("ADD", {"CNI_CONTAINERID": "a", "CNI_NETNS": NETNS, "CNI_IFNAME": "eth0"}, b'{"cniVersion":"9.9.9","name":"n"}'),
        ("ADD", {"CNI_CONTAINERID": "a", "CNI_NETNS": NETNS, "CNI_IFNAME": "eth0"}, b"[" * 100000),
        ("ADD", {"CNI_CONTAINERID": "a", "CNI_NETNS": NETNS, "CNI_IFNAME": "eth0"},
         json.dumps({"cniVersion": "1.0.0", "name": "n", "stateDir": state, "logFile": "", "prevResult": {"ips": 5}}).encode()),
        ("GC", {}, json.dumps({"cniVersion": "1.1.0", "name": "n", "stateDir": state, "logFile": "",
                               "cni.dev/valid-attachments": [{"containerID": "/x"}]}).encode()),
        ("DEL", {"CNI_CONTAINERID": "a", "CNI_IFNAME": "eth0"}, b'{"cniVersion":"1.0.0","name":"n","stateDir":"' + state.encode() + b'","logFile":""}'),
        ("FROB", {}, b"{}"),
        ("ADD", {}, b"\xff\xfe"),
        ("ADD", {"CNI_CONTAINERID": "a", "CNI_NETNS": NETNS, "CNI_IFNAME": "eth0"}, b'{"cniVersion":"1.0.0","name":"n","pad":"' + b"x" * (10 << 20) + b'"}'),
    ]
    # the code each must get (0: accepted): the spec's meaning, what a runtime acts on
    codes = [4, 4, 1, 6, 7, 0, 0, 4, 6, 7]
    for (command, env, stdin), code in zip(cases, codes, strict=True):
        full = dict(env, CNI_COMMAND=command, CNI_PATH="/opt/cni/bin", PATH="/usr/sbin:/usr/bin:/sbin:/bin")
        proc = subprocess.run([exe], env=full, input=stdin, capture_output=True, timeout=60)
        assert b"Traceback" not in proc.stderr + proc.stdout, (command, env)
        check_answer(proc.returncode, proc.stdout.decode(), command)
        assert (json.loads(proc.stdout)["code"] if proc.returncode else 0) == code, (command, env, proc.stdout[:300])
