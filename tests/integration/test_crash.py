"""Crash consistency: SIGKILL at random points of a sweep of 100 dead attachments (seeded, reproducible).
After each kill, one more invocation completes the clean-up; the state directory holds only valid records
and no temp debris; no live attachment lost anything. CNI_REAPER_CRASH_TRIALS sets the trials per flavour
(100 by default: 200 in all)."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

from cni_reaper.state.record import problem as record_problem
from testkit.artifacts import ip_of, leak, restore_text, write_records, write_reservations
from testkit.sandbox import Sandbox

pytestmark = pytest.mark.netns
TRIALS = int(os.environ.get("CNI_REAPER_CRASH_TRIALS", "100"))
NET = "nomad-reaper"


def plant(sb: Sandbox, live_netns: str):
    live = [(f"live-{k}", ip_of(1000 + k), 40000 + k, live_netns) for k in range(3)]
    dead = [(f"dead-{k}", ip_of(k), 20000 + k, f"/var/run/netns/gone-{k}") for k in range(100)]
    nat, filt = [], []
    for cid, ip, port, _ in live + dead:
        a, b, _ = leak(NET, cid, ip, port)
        nat += a
        filt += b
    sb.run([str(sb.bin_dir / "iptables-restore"), "--noflush"], input=restore_text(nat, filt), check=True)
    write_reservations(sb.cni_dir / "networks", NET, [(c, ip) for c, ip, _, _ in live + dead])
    write_records(sb, NET, live + dead)
    return live, dead


def status_proc(sb: Sandbox):
    conf = json.dumps(sb.status_conf())
    env = {"CNI_COMMAND": "STATUS", "CNI_PATH": str(sb.plugin_dir)}
    proc = sb.popen([str(sb.plugin_dir / "cni-reaper")], env=env, quiet=True)
    assert proc.stdin is not None
    proc.stdin.write(conf)
    proc.stdin.close()
    return proc


def test_sigkill_during_a_sweep_then_one_more_call_finishes_it(tmp_path, flavour, driver_bin):
    from testkit.sandbox import binary_exe, needs_root

    needs_root()
    exe = binary_exe()  # the built binary: what runs (and gets killed) on a client
    rng = random.Random(f"crash-{flavour}")
    durations = []
    for trial in range(TRIALS):
        with Sandbox(tmp_path / str(trial), flavour, exe, driver_bin) as sb:
            live_ns = sb.container()
            live, dead = plant(sb, live_ns)
            before = sb.tables()
            live_rules = {cid: sb.residue(NET, cid, [ip], before) for cid, ip, _, _ in live}
            proc = status_proc(sb)
            if trial == 0:  # measure one whole sweep to know where to aim the kills
                t0 = time.monotonic()
                proc.wait(timeout=120)
                durations.append(time.monotonic() - t0)
            else:
                time.sleep(rng.uniform(0, durations[0] * 1.2))
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
            rc, out, err = sb.status()  # one more invocation completes the clean-up
            assert rc == 0, (out, err)
            tables = sb.tables()
            for cid, ip, _, _ in dead:
                assert sb.residue(NET, cid, [ip], tables) == [], f"trial {trial}: {cid} left behind"
            for cid, ip, _, _ in live:
                assert sb.residue(NET, cid, [ip], tables) == live_rules[cid], f"trial {trial}: live {cid} lost something"
            names = sorted(p.name for p in sb.state_dir().iterdir())
            assert not [n for n in names if n.startswith(".tmp.") or n.endswith(".corrupt")], names
            records = [json.loads((sb.state_dir() / n).read_text()) for n in names if n.startswith("r-")]
            assert all(record_problem(r) is None for r in records)
            assert sorted(r["containerID"] for r in records) == sorted(c for c, *_ in live)
