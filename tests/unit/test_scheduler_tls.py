"""The scheduler's word over TLS, as a Nomad agent with `tls { http = true, verify_https_client = true }`
serves it: the CA (NOMAD_CACERT), the name its certificate has (NOMAD_TLS_SERVER_NAME, `client.global.nomad`,
not the address dialed), the client certificate it requires (NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY), and
NOMAD_SKIP_VERIFY. Real TLS between the stand-in and cni-reaper's client, on the loopback of a network
namespace made for the test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.sandbox import binary_exe

pytestmark = pytest.mark.netns
NODE = "5d5ed6c4-7b4b-43a0-9b59-8d9b2f7a3c11"
DONE = "0f0e0d0c-0b0a-4000-8000-000000000001"
TESTS = Path(__file__).resolve().parents[1]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def certificates(d: Path) -> None:
    """A CA, the agent's certificate for client.global.nomad only, and a client certificate, all by the CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=Nomad Agent CA", cwd=d)
    for name, san in (("agent", "DNS:client.global.nomad"), ("cli", "DNS:cli.global.nomad")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


RUNNER = r'''
import json, sys
from cni_reaper.reap import nomad, scheduler
from testkit.nomad_standin import Agent, Serving, client_dir
d = sys.argv[1]
client_dir(d + "/data", sys.argv[2])
agent = Agent(sys.argv[2], d + "/data")
agent.allocation(sys.argv[3], "complete")
out = {}
with Serving(agent, cert=d + "/agent.pem", key=d + "/agent.key", client_ca=d + "/ca.pem") as s:
    base = {"NOMAD_ADDR": s.address, "NOMAD_CLIENT_CERT": d + "/cli.pem", "NOMAD_CLIENT_KEY": d + "/cli.key"}
    cases = {
        "ca+name+cert": dict(base, NOMAD_CACERT=d + "/ca.pem", NOMAD_TLS_SERVER_NAME="client.global.nomad"),
        "capath+name+cert": dict(base, NOMAD_CAPATH=d + "/capath", NOMAD_TLS_SERVER_NAME="client.global.nomad"),
        "no-ca": dict(base, NOMAD_TLS_SERVER_NAME="client.global.nomad"),
        "wrong-name": dict(base, NOMAD_CACERT=d + "/ca.pem"),
        "no-client-cert": {"NOMAD_ADDR": s.address, "NOMAD_CACERT": d + "/ca.pem", "NOMAD_TLS_SERVER_NAME": "client.global.nomad"},
        "skip-verify": dict(base, NOMAD_SKIP_VERIFY="true"),
        "plain-http": dict(base, NOMAD_ADDR=s.address.replace("https", "http")),
    }
    for name, env in cases.items():
        w = scheduler.ask(nomad.Agent(nomad.Connection.of_env(env)), {sys.argv[3]})
        out[name] = {"over": sorted(w.over), "problems": w.problems}
    if len(sys.argv) > 4:  # the frozen bundle (its own Python and OpenSSL) asked the same, through doctor
        import subprocess
        for name in ("ca+name+cert", "no-ca"):
            env = dict(cases[name], CNI_REAPER_NOMAD="1", PATH="/usr/sbin:/usr/bin:/sbin:/bin")
            r = subprocess.run([sys.argv[4], "doctor", "--json", "--cni-conf-dir", d + "/none", "--state-dir",
                                d + "/state"], env=env, capture_output=True, text=True, timeout=60)
            found = [f for f in json.loads(r.stdout)["findings"] if f["check"] == "nomad"]
            out["bundle " + name] = found[0]["status"] + " " + found[0]["message"]
print(json.dumps(out))
'''


@pytest.mark.parametrize("exe", ["package", "binary"])
def test_tls_with_the_nomad_clis_settings(tmp_path, exe):
    """The package's client, and (binary) the frozen bundle's, whose Python and OpenSSL are its own."""
    extra = [binary_exe()] if exe == "binary" else []
    certificates(tmp_path)
    capath = tmp_path / "capath"
    capath.mkdir()
    h = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(tmp_path / "ca.pem")], capture_output=True,
                       text=True, check=True).stdout.strip()
    (capath / f"{h}.0").write_bytes((tmp_path / "ca.pem").read_bytes())
    run = subprocess.run(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, "-c",
                          RUNNER, str(tmp_path), NODE, DONE, *extra], capture_output=True, text=True, timeout=180,
                         env={"PYTHONPATH": f"{TESTS}:{TESTS.parent / 'plugin'}", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    for ok in ("ca+name+cert", "capath+name+cert", "skip-verify"):
        assert got[ok] == {"over": [DONE], "problems": []}, (ok, got[ok])
    for bad, said in (("no-ca", "CERTIFICATE_VERIFY_FAILED"), ("wrong-name", "CERTIFICATE_VERIFY_FAILED"),
                      ("no-client-cert", ""), ("plain-http", "")):
        assert got[bad]["over"] == [] and len(got[bad]["problems"]) == 1, (bad, got[bad])
        assert "cannot be asked" in got[bad]["problems"][0] and said in got[bad]["problems"][0], (bad, got[bad])
    if extra:
        assert got["bundle ca+name+cert"].startswith("OK ") and NODE in got["bundle ca+name+cert"], got
        assert got["bundle no-ca"].startswith("FAIL ") and "CERTIFICATE_VERIFY_FAILED" in got["bundle no-ca"], got
