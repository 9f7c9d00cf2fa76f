"""What undo may not put back is what the sweep and `list` hold (reap/claims.Holdings over sweep.holdings): the
same judgement, with the same settings for a record that carries none, and addresses compared as rules and
journal items name them. Both cases were found by a red team (a reservation put back for an address `list`
showed held)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time

import pytest
from test_schema import _valid_record

from cni_reaper.state import record as rec
from cni_reaper.state.store import record_name
from cni_reaper.tools import cli

pytestmark = pytest.mark.usefixtures("private_host")  # a throwaway netns and a private mount namespace
NET = "nomad-reaper"


def _cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue()


def _plant(tmp_path, holder: dict, ip: str) -> list[str]:
    """A state directory with `holder`'s record and a journaled reservation of `ip` for container X; the CLI's
    arguments for it."""
    state, cache, ipam = tmp_path / "s", tmp_path / "cache", tmp_path / "ipam"
    state.mkdir(mode=0o700)
    (cache / "results").mkdir(parents=True)
    (ipam / NET).mkdir(parents=True)
    assert rec.problem(holder) is None
    (state / record_name(NET, holder["containerID"], "eth0")).write_text(json.dumps(holder))
    item = {"kind": "reservation", "key": [NET, "X", "eth0"], "dataDir": str(ipam), "network": NET, "ip": ip,
            "content": "X\r\neth0"}
    now = time.time()
    (state / ".journal").write_text(json.dumps({"t": "intent", "id": "e1", "at": now, "verb": "sweep", "items": [item]})
                                    + "\n" + json.dumps({"t": "done", "id": "e1", "at": now, "removed": [0]}) + "\n")
    for p in state.iterdir():
        os.chmod(p, 0o600)
    return ["--state-dir", str(state), "--cni-cache-dir", str(cache), "--ipam-data-dir", str(ipam),
            "--cni-conf-dir", str(tmp_path / "noconf")]


@pytest.mark.parametrize("settings", [False, True], ids=["settings-null", "settings-recorded"])
def test_a_record_without_settings_holds_its_address_for_undo_as_for_list(tmp_path, settings):
    """A DEL in flight (a tombstone just written, libcni still caching the attachment in the configured cache
    directory, not in /var/lib/cni): `list` and the sweep hold its address, and so does undo."""
    w = _valid_record(2)
    w.update(containerID="W", earlier=[], deleted=rec.tombstone(True, True, True, True, cached=True).doc())
    w["current"]["ips"][0].update(address="10.9.9.9", reservation=None)
    args = _plant(tmp_path, w, "10.9.9.9")
    cache = tmp_path / "cache"
    w["settings"] = {"ipamDataDir": str(tmp_path / "ipam"), "cniCacheDir": str(cache), "backend": "auto"} if settings else None
    (tmp_path / "s" / record_name(NET, "W", "eth0")).write_text(json.dumps(w))
    (cache / "results" / f"{NET}-W-eth0").write_text(json.dumps({"kind": "cniCacheV1", "containerId": "W", "ifName": "eth0",
                                                                "networkName": NET, "netns": "/var/run/netns/W"}))
    os.makedirs("/var/lib/cni/results", exist_ok=True)  # libcni's default (the private mount's), empty
    [listed] = json.loads(_cli(["list", *args, "--json"])[1])
    report = json.loads(_cli(["undo", *args, "X", "--dry-run", "--json"])[1])
    assert listed["state"] == "torn down (DEL running)"
    assert report["restored"] == [] and "10.9.9.9 is held by the attachment W" in report["refused"][0]["why"]


@pytest.mark.parametrize("written", ["FD00::2", "fd00:0::2", "fd00::2"])
def test_an_address_a_record_spells_otherwise_is_held_for_undo(tmp_path, written):
    w = _valid_record(2)
    w.update(containerID="W", earlier=[], deleted=None)
    w["current"].update(netns="/proc/self/ns/net", netnsId=None)  # a namespace is at its path: live
    w["current"]["ips"] = [{"address": written, "prefix": 64, "family": 6, "reservation": None}]
    args = _plant(tmp_path, w, "fd00::2")
    report = json.loads(_cli(["undo", *args, "X", "--dry-run", "--json"])[1])
    assert report["restored"] == [] and "is held by the attachment W" in report["refused"][0]["why"]


def test_undo_says_a_record_it_did_not_put_back_is_not_put_back(tmp_path):
    """A later cni-reaper's record of the attachment is there, one this release cannot read even its key from
    (kept as it is, never written over): undo refuses to put the journaled record back and says why; it used to
    report "the record" as put back (red team rt44)."""
    w = _valid_record(2)
    w.update(containerID="W", earlier=[], deleted=None)
    w["current"]["ips"][0].update(address="10.9.9.7", reservation=None)
    args = _plant(tmp_path, w, "10.9.9.8")
    state = tmp_path / "s"
    x = _valid_record(2)
    x.update(containerID="X", earlier=[], deleted=None)
    x["current"]["ips"][0].update(address="10.9.9.8", reservation=None)
    x["current"].update(netns="/var/run/netns/gone-x", netnsId=None)
    later = {"schema": 4, "network": NET, "containerID": 7, "ifname": "eth0"}  # its key unreadable here
    (state / record_name(NET, "X", "eth0")).write_text(json.dumps(later))
    os.chmod(state / record_name(NET, "X", "eth0"), 0o600)
    with open(state / ".journal", "a") as f:
        now = time.time()
        f.write(json.dumps({"t": "intent", "id": "e2", "at": now, "verb": "sweep",
                            "items": [{"kind": "record", "key": [NET, "X", "eth0"], "record": x}]}) + "\n")
        f.write(json.dumps({"t": "done", "id": "e2", "at": now, "removed": [0]}) + "\n")
    report = json.loads(_cli(["undo", *args, "X", "--json", "--log-file", str(tmp_path / "log")])[1])
    assert not [r for r in report["restored"] if "the record" in r], report
    assert any("later cni-reaper" in r["why"] for r in report["refused"]), report
    assert json.loads((state / record_name(NET, "X", "eth0")).read_text()) == later  # kept as it is
