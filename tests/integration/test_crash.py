"""Crash consistency: SIGKILL at random points of a sweep of 100 dead attachments (seeded, reproducible).
After each kill, one more invocation completes the clean-up; the state directory holds only valid records
and no temp debris; no live attachment lost anything. CNI_REAPER_CRASH_TRIALS sets the trials per flavour
(100 by default: 200 in all)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
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


JOURNAL_TRIALS = int(os.environ.get("CNI_REAPER_JOURNAL_CRASH_TRIALS", "12"))


def _reservations(sb: Sandbox) -> dict[str, str]:
    return {p.name: p.read_text() for p in (sb.cni_dir / "networks" / NET).glob("172.*")}


def _journaled(sb: Sandbox) -> tuple[set[str], set[str]]:
    """The rule lines and reservations the journal says were (perhaps) removed."""
    out = sb.run([str(sb.plugin_dir / "cni-reaper"), "journal", "--json", "--cni-conf-dir", str(sb.root / "none")])
    lines, ips = set(), set()
    for e in json.loads(out.stdout):
        it = e["item"]
        if it["kind"] == "iptables" and it["op"] == "rule":
            lines.add(f"-A {it['chain']} {it['spec']}")
        elif it["kind"] == "iptables":
            lines |= {f"-A {it['chain']} {s}" for s in it["rules"]}
        elif it["kind"] == "reservation":
            ips.add(it["ip"])
    return lines, ips


def _undo_all(sb: Sandbox, dead: list, kill_after: float | None = None) -> None:
    for cid, *_ in dead:
        argv = sb.wrap([str(sb.plugin_dir / "cni-reaper"), "undo", cid, "--cni-conf-dir", str(sb.root / "none")])
        proc = subprocess.Popen(argv, env=sb.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if kill_after is not None:
            time.sleep(kill_after)
            os.kill(proc.pid, signal.SIGKILL)
            kill_after = None  # one undo is cut; the others run whole
        proc.wait(timeout=120)


def test_sigkill_during_a_clean_up_or_an_undo_leaves_a_journal_that_is_never_wrong(tmp_path, flavour, package_exe, driver_bin):
    """A clean-up killed at a random moment (seeded): everything that is gone is in the journal (written before
    it went). Undo of every dead attachment then puts the tables and reservations back as they were; and an
    undo killed at a random moment, undone once more, does too."""
    from testkit.sandbox import needs_root

    needs_root()
    rng = random.Random(f"journal-crash-{flavour}")
    for trial in range(JOURNAL_TRIALS):
        with Sandbox(tmp_path / str(trial), flavour, package_exe, driver_bin) as sb:
            live_ns = sb.container()
            live = [(f"live-{k}", ip_of(1000 + k), 40000 + k, live_ns) for k in range(2)]
            dead = [(f"dead-{k}", ip_of(k), 20000 + k, f"/var/run/netns/gone-{k}") for k in range(6)]
            nat, filt = [], []
            for cid, ip, port, _ in live + dead:
                a, b, _ = leak(NET, cid, ip, port)
                nat += a
                filt += b
            sb.run([str(sb.bin_dir / "iptables-restore"), "--noflush"], input=restore_text(nat, filt), check=True)
            write_reservations(sb.cni_dir / "networks", NET, [(c, ip) for c, ip, _, _ in live + dead])
            write_records(sb, NET, live + dead)
            before, held = sb.normalized_tables(), _reservations(sb)
            proc = status_proc(sb)
            time.sleep(rng.uniform(0, 0.6))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            now, kept = set(sb.normalized_tables()), _reservations(sb)
            lines, ips = _journaled(sb)
            gone = [l for l in before if l.startswith("-A ") and l not in now]
            assert set(gone) <= lines, f"trial {trial}: removed without a journal line: {sorted(set(gone) - lines)[:3]}"
            assert set(held) - set(kept) <= ips, f"trial {trial}: a reservation went without a journal line"
            rc, out, err = sb.status()  # the clean-up finished by the next call
            assert rc == 0, (out, err)
            _undo_all(sb, dead, kill_after=rng.uniform(0, 0.4) if trial % 2 else None)
            _undo_all(sb, dead)  # what the cut undo left, this one puts back; what it did, this one leaves
            assert sb.normalized_tables() == before, f"trial {trial}: undo did not put the tables back"
            assert _reservations(sb) == held, f"trial {trial}: undo did not put the reservations back"
