"""cni-reaper benchmarks (run by scripts/bench.sh). Every measurement runs in throwaway network namespaces.

Plugin calls are timed the way a runtime makes them (fork, exec, environment, stdin) from inside the host
netns, with Nomad's request shape (each port mapped for tcp and for udp), interleaved A B A B and compared
by medians, so that machine noise hits both sides alike. Anchors in the same run: the Go `portmap` plugin
(the peer), the floors (a one-folder bundle of a program that only passes prevResult through, built like
cni-reaper: `floor` with cni-reaper's bootloader, `floor-stock` with PyInstaller's own) and two limits (a
static C program that does nothing, `python3 -I -S -c pass`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testkit.artifacts import (
    NATIVE_SETUP,
    conntrack_entry,
    ip_of,
    leak,
    native_leak,
    restore_text,
    write_records,
    write_reservations,
)
from testkit.sandbox import Sandbox, build_driver, unique

REPO = Path(__file__).resolve().parent.parent
DIST = REPO / "dist"
BINARY = DIST / "cni-reaper" / "cni-reaper"
FLOOR, FLOOR_STOCK = DIST / "floor" / "floor", DIST / "floor-stock" / "floor-stock"
PORTMAP = "/usr/lib/cni/portmap"
NETWORK = "bench"
FLAVOURS = ("nft", "legacy")

HARNESS = r"""
import json, os, sys, tempfile, time
err_file = tempfile.TemporaryFile()
for line in sys.stdin:
    job = json.loads(line)
    r, w = os.pipe()
    o_r, o_w = os.pipe()
    err_file.seek(0); err_file.truncate()
    t0 = time.monotonic_ns()
    pid = os.fork()
    if pid == 0:
        os.dup2(r, 0); os.dup2(o_w, 1); os.dup2(err_file.fileno(), 2)
        os.close(w); os.close(o_r)
        argv = job.get("argv") or [job["exe"]]
        os.execve(argv[0], argv, job["env"])
    os.close(r); os.close(o_w)
    os.write(w, job["stdin"].encode()); os.close(w)
    out = []
    while True:
        b = os.read(o_r, 65536)
        if not b:
            break
        out.append(b)
    os.close(o_r)
    _, status, usage = os.wait4(pid, 0)
    t1 = time.monotonic_ns()
    err_file.seek(0)
    err = err_file.read()
    sys.stdout.write(json.dumps({"t0": t0, "t1": t1, "rc": os.waitstatus_to_exitcode(status), "kib": usage.ru_maxrss,
                                 "cpu": usage.ru_utime + usage.ru_stime,
                                 "out": b"".join(out).decode(), "err": err.decode()[-4000:]}) + "\n")
    sys.stdout.flush()
"""


class Runner:
    """Runs plugin calls from inside a netns the way a runtime does, so that `ip netns exec`'s own cost (a
    mount namespace, a /sys remount) is in no measurement. Peak RSS comes from wait4 on the plugin itself."""

    def __init__(self, host: str, bin_dir: Path) -> None:
        self.path = f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
        self.proc = subprocess.Popen(["ip", "netns", "exec", host, sys.executable, "-c", HARNESS],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, exe, env: dict[str, str], stdin: str = "", argv: list[str] | None = None) -> dict:
        job = {"exe": str(exe), "env": {"PATH": self.path, **env}, "stdin": stdin, "argv": argv}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        r = json.loads(self.proc.stdout.readline())
        r["s"] = (r["t1"] - r["t0"]) / 1e9
        return r

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def cni_env(command: str, cid: str = "", netns: str = "", ifname: str = "eth0") -> dict[str, str]:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
            "CNI_PATH": "/usr/lib/cni"}


def conf(tmp: Path, ip: str, port: int, version: str = "1.0.0", netns: str = "", state: str = "state") -> str:
    """What portmap and cni-reaper get from go-cni for a Nomad allocation: the port as Go fields, tcp and udp."""
    return json.dumps({
        "cniVersion": version, "name": NETWORK, "type": "bench", "snat": True,
        "capabilities": {"portMappings": True},
        "stateDir": str(tmp / state), "ipamDataDir": str(tmp / "ipam"), "cniCacheDir": str(tmp / "cache"),
        "logFile": "",
        "runtimeConfig": {"portMappings": [{"HostPort": port, "ContainerPort": 80, "Protocol": p, "HostIP": ""}
                                           for p in ("tcp", "udp")]},
        "prevResult": {"cniVersion": version, "interfaces": [{"name": "eth0", "sandbox": netns}],
                       "ips": [{"address": f"{ip}/16", "interface": 0, "gateway": "172.26.0.1"}]},
    })


def status_conf(tmp: Path, state: str = "state") -> str:
    return json.dumps({"cniVersion": "1.1.0", "name": NETWORK, "type": "cni-reaper", "stateDir": str(tmp / state),
                       "ipamDataDir": str(tmp / "ipam"), "cniCacheDir": str(tmp / "cache"), "logFile": ""})


def median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 2)


def paired_ms(samples: dict[str, list[dict]], a: str, b: str) -> float:
    """The median of a - b over the rounds of interleaved(): what the machine's drift between rounds cancels out of."""
    return median_ms([x["s"] - y["s"] for x, y in zip(samples[a], samples[b])])


def interleaved(pairs: int, calls: dict) -> dict[str, list[dict]]:
    """Run each named call once per round, the order reversed every other round."""
    out: dict[str, list[dict]] = {name: [] for name in calls}
    names = list(calls)
    for i in range(pairs):
        for name in (names if i % 2 == 0 else list(reversed(names))):
            r = calls[name](i)
            assert r["rc"] == 0, (name, r["out"], r["err"])
            out[name].append(r)
    return out


# -- limits and floors ----------------------------------------------------------------------------------
def static_noop(tmp: Path) -> Path:
    src, exe = tmp / "noop.c", tmp / "noop"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-O2", "-static", "-o", str(exe), str(src)], check=True)
    return exe


def bench_limits(pairs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="cni-reaper-bench-") as t:
        tmp = Path(t)
        noop = static_noop(tmp)
        with Sandbox(tmp / "sb", "nft", str(BINARY)) as sb:
            run = Runner(sb.host, sb.bin_dir)
            doc = json.dumps({"cniVersion": "1.0.0", "prevResult": {"cniVersion": "1.0.0", "ips": []}})
            py = "/usr/bin/python3"
            calls = {"static C no-op": lambda i: run(noop, {}),
                     "python3 -I -S -c pass": lambda i: run(py, {}, argv=[py, "-I", "-S", "-c", "pass"]),
                     "floor (cni-reaper's bootloader)": lambda i: run(FLOOR, {}, doc),
                     "floor-stock (PyInstaller's bootloader)": lambda i: run(FLOOR_STOCK, {}, doc),
                     "cni-reaper VERSION": lambda i: run(BINARY, {"CNI_COMMAND": "VERSION"})}
            samples = interleaved(pairs, calls)
            run.close()
    return {name: median_ms([r["s"] for r in rs]) for name, rs in samples.items()}


# -- the verbs, per flavour -------------------------------------------------------------------------------
def bench_verbs(flavour: str, pairs: int, driver: str, release: tuple[str, Path] | None = None) -> dict:
    """ADD and DEL with nothing stale against portmap's, the floor and (`release`: its version and bundle)
    the last release's, interleaved in the same rounds; each one's state directory its own."""
    with tempfile.TemporaryDirectory(prefix="cni-reaper-bench-") as t:
        tmp = Path(t)
        with Sandbox(tmp / "sb", flavour, str(BINARY), driver) as sb:
            run = Runner(sb.host, sb.bin_dir)
            live = sb.container()
            # 1,000 live records beside an empty state dir: what nothing stale costs at scale
            plant(sb, tmp, 1000, live_netns=live, state="state-1000")
            (tmp / "state").mkdir()
            (tmp / "state-release").mkdir()
            if release is not None:  # the same 1,000 records for the release
                shutil.copytree(tmp / "state-1000", tmp / "state-1000-release", symlinks=True)
            for d in ("state-1000", "state-1000-release"):  # each index made by its own release's first call,
                for p in (tmp / d).glob(".index*"):  # outside the rounds: both journals begin empty
                    p.unlink()
            stages: list[dict] = []

            def reaper_add(i):
                r = run(BINARY, {**cni_env("ADD", f"alloc-{i}", live), "CNI_REAPER_STAGES": "1"},
                        conf(tmp, ip_of(i), 30000 + i, netns=live))
                stages.append(staged(r))
                return r

            calls = {
                "cni-reaper ADD": reaper_add,
                "portmap ADD": lambda i: run(PORTMAP, cni_env("ADD", f"alloc-{i}", live), conf(tmp, ip_of(i), 30000 + i, netns=live)),
                "floor": lambda i: run(FLOOR, cni_env("ADD", f"alloc-{i}", live), conf(tmp, ip_of(i), 30000 + i, netns=live)),
                "cni-reaper ADD, 1,000 live records": lambda i: run(BINARY, cni_env("ADD", f"big-{i}", live),
                                                                    conf(tmp, ip_of(2000 + i), 31000 + i, netns=live, state="state-1000")),
            }
            if release is not None:
                calls[f"{release[0]} ADD"] = lambda i: run(release[1], cni_env("ADD", f"rel-{i}", live),
                                                           conf(tmp, ip_of(5000 + i), 34000 + i, netns=live, state="state-release"))
                calls[f"{release[0]} ADD, 1,000 live records"] = lambda i: run(
                    release[1], cni_env("ADD", f"relbig-{i}", live),
                    conf(tmp, ip_of(6000 + i), 35000 + i, netns=live, state="state-1000-release"))
                calls[f"{release[0]} ADD, 1,000 live records"](pairs)  # its index made outside the rounds
            calls["cni-reaper ADD, 1,000 live records"](pairs)
            adds = interleaved(pairs, calls)
            calls = {
                "cni-reaper DEL, nothing stale": lambda i: run(BINARY, cni_env("DEL", f"alloc-{i}", live),
                                                               conf(tmp, ip_of(i), 30000 + i, netns=live)),
                "portmap DEL": lambda i: run(PORTMAP, cni_env("DEL", f"alloc-{i}", live), conf(tmp, ip_of(i), 30000 + i, netns=live)),
                "cni-reaper DEL, 1,000 live records": lambda i: run(BINARY, cni_env("DEL", f"big-{i}", live),
                                                                    conf(tmp, ip_of(2000 + i), 31000 + i, netns=live, state="state-1000")),
            }
            if release is not None:
                calls[f"{release[0]} DEL, nothing stale"] = lambda i: run(
                    release[1], cni_env("DEL", f"rel-{i}", live),
                    conf(tmp, ip_of(5000 + i), 34000 + i, netns=live, state="state-release"))
                calls[f"{release[0]} DEL, 1,000 live records"] = lambda i: run(
                    release[1], cni_env("DEL", f"relbig-{i}", live),
                    conf(tmp, ip_of(6000 + i), 35000 + i, netns=live, state="state-1000-release"))
            dels = interleaved(pairs, calls)
            listed = bench_list(run, tmp / "state-1000", live, release, max(5, pairs // 3))
            scale = bench_scale(run, tmp, live, 3 * pairs)
            # a DEL that cleans one dead attachment (its netns is gone)
            dead_dels = []
            for i in range(pairs):
                gone = sb.container()
                dcid, dip = f"dead-{i}", ip_of(3000 + i)
                dconf = conf(tmp, dip, 32000 + i, netns=gone)
                assert run(BINARY, cni_env("ADD", dcid, gone), dconf)["rc"] == 0
                nat, filt, _ = leak(NETWORK, dcid, dip, 32000 + i)
                sb.run([str(sb.bin_dir / "iptables-restore"), "--noflush"], input=restore_text(nat, filt), check=True)
                sb.remove_container(gone)
                r = run(BINARY, cni_env("DEL", dcid, gone), dconf)
                assert r["rc"] == 0 and f'id: \\"{dcid}\\"' not in sb.save(4, "nat"), "the dead attachment was not cleaned"
                dead_dels.append(r)
                run(BINARY, cni_env("STATUS"), status_conf(tmp))  # settle the tombstone outside the next measurement
            run.close()
            journal = bench_journal(tmp, tmp / "state", pairs)
            chain = bench_chain(sb, pairs)
            wrap = bench_wrap(sb, pairs)
            alone = Runner(sb.host, sb.bin_dir)
            wrap_alone = bench_wrap_alone(alone, tmp, pairs, live)
            alone.close()
    samples = {**adds, **dels, "cni-reaper DEL cleaning one dead attachment": dead_dels}
    med = {name: median_ms([r["s"] for r in rs]) for name, rs in samples.items()}
    rss = {name: round(max(r["kib"] for r in rs) / 1024, 1) for name, rs in samples.items()}
    stage_med = {k: round(statistics.median(s[k] for s in stages), 2) for k in stages[0]}
    return {"flavour": flavour, "medians_ms": med, "peak_rss_mib": rss, "stages_ms": stage_med, "chain_ms": chain,
            "wrap_ms": wrap, "wrap_alone_ms": wrap_alone, "journal_ms": journal, "scale_ms": scale, "list_ms": listed,
            "ratios": {
                "journal share of a cleaning DEL": round(journal["per cleaning DEL"]
                                                         / med["cni-reaper DEL cleaning one dead attachment"], 3),
                "bridge ADD share, wrapper": round(wrap["ADD with the wrapper"] / wrap["ADD without"] - 1, 3),
                "bridge ADD share, chained last": round(wrap["ADD with cni-reaper chained last"] / wrap["ADD without"] - 1, 3),
                "bridge DEL share, wrapper": round(wrap["DEL with the wrapper"] / wrap["DEL without"] - 1, 3),
                "bridge DEL share, chained last": round(wrap["DEL with cni-reaper chained last"] / wrap["DEL without"] - 1, 3),
                "ADD / portmap ADD": round(med["cni-reaper ADD"] / med["portmap ADD"], 3),
                "DEL nothing stale / portmap DEL": round(med["cni-reaper DEL, nothing stale"] / med["portmap DEL"], 3),
                "ADD with 1,000 live records - ADD (ms)": round(med["cni-reaper ADD, 1,000 live records"] - med["cni-reaper ADD"], 2),
                "DEL with 1,000 live records - DEL (ms)": round(med["cni-reaper DEL, 1,000 live records"] - med["cni-reaper DEL, nothing stale"], 2),
                "ADD with 1,000 live records - ADD, paired rounds (ms)": paired_ms(samples, "cni-reaper ADD, 1,000 live records", "cni-reaper ADD"),
                "DEL with 1,000 live records - DEL, paired rounds (ms)": paired_ms(samples, "cni-reaper DEL, 1,000 live records",
                                                                              "cni-reaper DEL, nothing stale"),
                "chain ADD share": round(chain["with cni-reaper"] / chain["without"] - 1, 3),
                "chain ADD share of the floor": round(chain["with the floor"] / chain["without"] - 1, 3),
                **_against_release(samples, release[0] if release else None),
            }}


def bench_list(run: Runner, state: Path, live: str, release: tuple[str, Path] | None, rounds: int) -> dict[str, float]:
    """`cni-reaper list --json` of a state directory of 1,000 live records (the operator's command loads pydantic
    for its output), main's and the release's interleaved; medians (ms), and main's over the release's."""
    argv = ["list", "--json", "--state-dir", str(state), "--cni-conf-dir", str(state.parent / "no-conflists")]
    calls = {"list, 1,000 records": lambda i: run(BINARY, {}, argv=[str(BINARY), *argv])}
    if release is not None:
        calls[f"{release[0]} list, 1,000 records"] = lambda i: run(release[1], {}, argv=[str(release[1]), *argv])
    samples = interleaved(rounds, calls)
    out = {name: median_ms([r["s"] for r in rs]) for name, rs in samples.items()}
    if release is not None:
        out["list - release's list (ms), paired rounds"] = paired_ms(samples, "list, 1,000 records",
                                                                    f"{release[0]} list, 1,000 records")
    return out


def _against_release(samples: dict[str, list[dict]], version: str | None) -> dict[str, float]:
    """ADD and DEL with nothing stale over the release's, from the same rounds (the median of the rounds'
    ratios: each pair ran beside the other)."""
    if version is None:
        return {}
    out = {}
    for verb, mine, theirs_name in (
            ("ADD", "cni-reaper ADD", f"{version} ADD"),
            ("DEL nothing stale", "cni-reaper DEL, nothing stale", f"{version} DEL, nothing stale"),
            ("ADD with 1,000 live records", "cni-reaper ADD, 1,000 live records", f"{version} ADD, 1,000 live records"),
            ("DEL with 1,000 live records", "cni-reaper DEL, 1,000 live records", f"{version} DEL, 1,000 live records")):
        theirs = samples[theirs_name]
        out[f"{verb} / {version} {verb}"] = round(statistics.median(a["s"] / b["s"] for a, b in zip(samples[mine], theirs)), 3)
    return out


def bench_scale(run: Runner, tmp: Path, live: str, rounds: int) -> dict:
    """What 1,000 live records add to an ADD and to a DEL with nothing stale, each call beside its twin on a
    state directory that starts empty (the two one after the other, the order swapped every other round),
    over `rounds` rounds: the median of the differences, the figure the target reads."""
    (tmp / "state-scale").mkdir()

    def call(verb: str, state: str, i: int) -> dict:
        return run(BINARY, cni_env(verb, f"{state}-{i}", live),
                   conf(tmp, ip_of(4000 + i + (rounds if state == "state-1000" else 0)), 33000 + i, netns=live,
                        state=state))

    out = {}
    for verb in ("ADD", "DEL"):
        got = interleaved(rounds, {"empty": lambda i, v=verb: call(v, "state-scale", i),
                                   "1,000": lambda i, v=verb: call(v, "state-1000", i)})
        out[f"{verb} with 1,000 live records - {verb}, side by side"] = paired_ms(got, "1,000", "empty")
        # the CPU time of the same calls (wait4: user + system): what the work costs, without the time the
        # machine gave to others (a virtual machine's steal moves the wall clock by milliseconds a call)
        out[f"{verb} with 1,000 live records - {verb}, side by side, CPU time"] = median_ms(
            [x["cpu"] - y["cpu"] for x, y in zip(got["1,000"], got["empty"])])
    return out


def staged(r: dict) -> dict:
    """Where one call's time went, from the stamps cni-reaper writes with CNI_REAPER_STAGES (monotonic ns)."""
    s = next(json.loads(l)["stages"] for l in r["err"].splitlines() if l.startswith('{"stages"'))
    return {"start (exec, loader, interpreter, to main)": (s["main"] - r["t0"]) / 1e6,
            "imports (the protocol shell)": (s["imported"] - s["main"]) / 1e6,
            "work (the verb, its imports included)": (s["done"] - s["imported"]) / 1e6,
            "exit": (r["t1"] - s["done"]) / 1e6, "total": (r["t1"] - r["t0"]) / 1e6,
            # the bundle's code index serves them all (build/codeindex.py): 0 unless it broke
            "modules imported from their own files": len(s.get("from_files", ()))}


def bench_chain(sb: Sandbox, pairs: int) -> dict:
    """The whole Nomad bridge chain's ADD through go-cni, with cni-reaper appended, with the floor appended in
    its place (what any one-folder Python plugin adds), and with nothing appended."""
    with_reaper, without = sb.conflist(), sb.conflist(without_reaper=True)
    doc = json.loads(with_reaper.read_text())
    doc["plugins"][-1] = {"type": "floor"}
    with_floor = sb.root / "with-floor.conflist"
    with_floor.write_text(json.dumps(doc))
    if not (sb.plugin_dir / "floor").exists():
        (sb.plugin_dir / "floor").symlink_to(FLOOR)
    samples: dict[str, list[float]] = {"with cni-reaper": [], "with the floor": [], "without": []}
    for i in range(pairs):
        order = [("with cni-reaper", with_reaper), ("with the floor", with_floor), ("without", without)]
        for name, cl in (order if i % 2 == 0 else list(reversed(order))):
            netns = sb.container()
            cid = unique("chain-")
            t0 = time.perf_counter()
            proc = sb.driver("add", cid, netns, ("8080:80/tcp", "8080:80/udp"), cl)
            samples[name].append(time.perf_counter() - t0)
            assert proc.returncode == 0, proc.stderr
            sb.driver("del", cid, netns, ("8080:80/tcp", "8080:80/udp"), cl)
            sb.remove_container(netns)
    return {name: median_ms(xs) for name, xs in samples.items()}


def bench_journal(tmp: Path, state: Path, pairs: int) -> dict:
    """What the journal costs a cleaning DEL: the journal lines the measured cleaning DELs wrote (what they were
    about to remove, then what they removed), written again the way the clean-up writes them (appended and
    fsynced one by one) into a state directory on the same file system, timed."""
    sys.path.insert(0, str(REPO / "plugin"))
    from cni_reaper.state.journal import NAME
    from cni_reaper.state.store import Store

    every = (state / NAME).read_bytes().splitlines(keepends=True)
    ids = {e["id"] for e in map(json.loads, every) if e.get("t") == "intent" and e.get("verb") == "DEL"}
    lines = [line for line in every if json.loads(line).get("id") in ids]
    per_del = max(1, len(lines) // max(pairs, 1))
    replay = tmp / "journal-replay"
    replay.mkdir()
    store = Store(str(replay)).open()
    samples = []
    try:
        for i in range(pairs):
            batch = lines[i * per_del:(i + 1) * per_del] or lines[:per_del]
            t0 = time.perf_counter()
            for line in batch:
                fd = os.open(NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=store.dir.dfd)
                try:
                    os.write(fd, line)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            samples.append(time.perf_counter() - t0)
    finally:
        store.close()
    return {"per cleaning DEL": median_ms(samples), "lines per cleaning DEL": per_del,
            "bytes per cleaning DEL": sum(len(x) for x in lines[:per_del])}


def bench_wrap(sb: Sandbox, pairs: int) -> dict:
    """Nomad's own bridge network (its conflist exactly, cniVersion 0.4.0) through go-cni, ADD and then DEL with
    nothing stale: as Nomad runs it, with cni-reaper's wrapper first on the plugin path (wrap mode), and with
    cni-reaper appended to the same conflist (chained last, as a cni/ network has it)."""
    from testkit.nomad import bridge_conflist

    plain_doc = bridge_conflist()
    chained_doc = json.loads(json.dumps(plain_doc))
    chained_doc["plugins"].append({"type": "cni-reaper", "capabilities": {"portMappings": True},
                                   "ipamDataDir": "/var/run/cni", "logFile": ""})
    plain, chained = sb.root / "bridge.conflist", sb.root / "bridge-chained.conflist"
    plain.write_text(json.dumps(plain_doc))
    chained.write_text(json.dumps(chained_doc))
    wrap_dir = sb.root / "wrap"
    wrap_dir.mkdir(exist_ok=True)
    if not (wrap_dir / "portmap").exists():
        (wrap_dir / "portmap").symlink_to(sb.plugin_dir / "cni-reaper")
    settings = sb.root / "wrap-settings.json"
    settings.write_text(json.dumps({"logFile": "", "ipamDataDir": "/var/run/cni"}))
    sb.extra_env["CNI_REAPER_CONFIG"] = str(settings)
    plain_path = f"{sb.plugin_dir}:{sb.plugins}"
    ways = [("without", plain, plain_path), ("with the wrapper", plain, f"{wrap_dir}:{plain_path}"),
            ("with cni-reaper chained last", chained, plain_path)]
    samples: dict[str, list[float]] = {f"{verb} {name}": [] for verb in ("ADD", "DEL") for name, _, _ in ways}
    ports = ("8080:80/tcp", "8080:80/udp")
    try:
        for i in range(pairs):
            for name, cl, path in (ways if i % 2 == 0 else list(reversed(ways))):
                sb.plugin_path = path
                netns, cid = sb.container(), unique("wrap-")
                t0 = time.perf_counter()
                proc = sb.driver("add", cid, netns, ports, cl)
                samples[f"ADD {name}"].append(time.perf_counter() - t0)
                assert proc.returncode == 0, proc.stderr
                t0 = time.perf_counter()
                proc = sb.driver("del", cid, netns, ports, cl)
                samples[f"DEL {name}"].append(time.perf_counter() - t0)
                assert proc.returncode == 0, proc.stderr
                sb.remove_container(netns)
    finally:
        sb.plugin_path = ""
        sb.extra_env.pop("CNI_REAPER_CONFIG", None)
    out = {name: median_ms(xs) for name, xs in samples.items()}
    for verb in ("ADD", "DEL"):  # the same round's calls side by side: what the machine's drift cancels out of
        deltas = [w - c for w, c in zip(samples[f"{verb} with the wrapper"], samples[f"{verb} with cni-reaper chained last"])]
        out[f"{verb}: the wrapper - chained last, paired"] = median_ms(deltas)
    return out


STAND_IN = r"""
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
/* portmap's stand-in: reads stdin, keeps a core busy for STAND_IN_MS, prints STAND_IN_RESULT */
int main(void) {
    char buf[65536];
    while (read(0, buf, sizeof buf) > 0) {}
    const char *ms = getenv("STAND_IN_MS"), *r = getenv("STAND_IN_RESULT");
    long n = ms ? atol(ms) : 30, spent;
    struct timespec a, b;
    volatile unsigned long x = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do {
        for (int i = 0; i < 10000; i++) x += i;
        clock_gettime(CLOCK_MONOTONIC, &b);
        spent = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
    } while (spent < n);
    if (r && write(1, r, strlen(r)) < 0) return 1;
    return 0;
}
"""


def bench_wrap_alone(run: Runner, tmp: Path, pairs: int, live: str) -> dict:
    """What cni-reaper adds to portmap's call, with nothing else in the measurement: portmap through the
    wrapper, against portmap and then cni-reaper as libcni runs them when cni-reaper is chained last (ADD:
    portmap, then cni-reaper with its result; DEL: cni-reaper, then portmap). The plugin is a stand-in that
    keeps a core busy for 30 ms (about what portmap's ADD takes here) and prints the result it is given: the
    real one's run-to-run spread (its iptables calls) is larger than the difference measured. With an empty
    state directory and with 1,000 live records."""
    bin_dir, wrap_dir = tmp / "stand-in", tmp / "wrap-alone"
    bin_dir.mkdir(exist_ok=True)
    wrap_dir.mkdir(exist_ok=True)
    (bin_dir / "stand-in.c").write_text(STAND_IN)
    stand_in = bin_dir / "portmap"
    subprocess.run(["gcc", "-O2", "-static", "-o", str(stand_in), str(bin_dir / "stand-in.c")], check=True)
    link = wrap_dir / "portmap"
    if not link.exists():
        link.symlink_to(BINARY)
    def ok(r: dict) -> float:
        assert r["rc"] == 0, (r["out"], r["err"])
        return r["s"]

    def call(way: str, verb: str, cid: str, c: str, settings: Path) -> float:
        env = {**cni_env(verb, cid, live), "CNI_PATH": str(bin_dir), "STAND_IN_MS": "30",
               "STAND_IN_RESULT": json.dumps(json.loads(c)["prevResult"]), "CNI_REAPER_CONFIG": str(settings)}
        if way == "w":
            return ok(run(link, env, c))
        return sum(ok(run(exe, env, c)) for exe in ((stand_in, BINARY) if verb == "ADD" else (BINARY, stand_in)))

    out: dict[str, float] = {}
    for state, label in (("state-wrap", ""), ("state-1000", ", 1,000 live records")):
        (tmp / state).mkdir(exist_ok=True)
        settings = tmp / f"wrap-alone-{state}.json"
        settings.write_text(json.dumps({"logFile": "", "stateDir": str(tmp / state), "ipamDataDir": str(tmp / "ipam"),
                                        "cniCacheDir": str(tmp / "cache")}))
        samples: dict[str, list[float]] = {k: [] for k in ("ADD w", "ADD c", "DEL w", "DEL c")}
        for i in range(pairs):
            confs = {"w": conf(tmp, ip_of(4000 + i), 33000 + i, netns=live, state=state),
                     "c": conf(tmp, ip_of(5000 + i), 34000 + i, netns=live, state=state)}
            for verb in ("ADD", "DEL"):
                for way in ("w", "c") if i % 2 == 0 else ("c", "w"):
                    samples[f"{verb} {way}"].append(call(way, verb, f"{way}a-{state}-{i}", confs[way], settings))
        for verb in ("ADD", "DEL"):
            out[f"{verb} through the wrapper{label}"] = median_ms(samples[f"{verb} w"])
            out[f"{verb} chained last{label}"] = median_ms(samples[f"{verb} c"])
            deltas = [w - c for w, c in zip(samples[f"{verb} w"], samples[f"{verb} c"])]
            out[f"{verb}: the wrapper - chained last, paired{label}"] = median_ms(deltas)
    return out


# -- sweeps -------------------------------------------------------------------------------------------
def plant(sb: Sandbox, tmp: Path, n: int, live_netns: str | None = None, state: str = "state",
          native: bool = False) -> list[list[str]]:
    """N attachments: N records (dead, or live on `live_netns`) and, for dead ones, what the plugins leave
    (iptables, or their native nftables tables) and a host-local reservation each. Returns the per-rule
    removal commands (Nomad's way) for the iptables leftovers."""
    nat, filt, cmds, nft = [], [], [], [NATIVE_SETUP]
    items = []
    for i in range(n):
        cid, ip, port = f"att-{i:05d}", ip_of(i), 20000 + i
        items.append((cid, ip, port, live_netns or f"/var/run/netns/bench-gone-{i}"))
        if live_netns is None and native:
            nft += native_leak(NETWORK, cid, ip, port)
        elif live_netns is None:
            a, b, c = leak(NETWORK, cid, ip, port)
            nat += a
            filt += b
            cmds += c
    if live_netns is None:
        write_reservations(tmp / "ipam", NETWORK, [(cid, ip) for cid, ip, _, _ in items])
    write_records(sb, NETWORK, items, state_dir=tmp / state, ipam_dir=tmp / "ipam")
    if live_netns is None:
        if native:
            sb.run(["nft", "-f", "-"], input="\n".join(nft) + "\n", check=True)
        else:
            sb.run([str(sb.bin_dir / "iptables-restore"), "--noflush"], input=restore_text(nat, filt), check=True)
    return cmds


def count_cni_lines(sb: Sandbox) -> int:
    text = sb.save(4, "nat") + sb.save(4, "filter")
    return sum(1 for l in text.splitlines() if l.startswith("-A") and ("CNI-" in l) and "HOSTPORT-SETMARK -" not in l)


NOMAD_WAY = """
import json, subprocess, sys, time, os
cmds = json.load(open(sys.argv[1])); tool = sys.argv[2]; ipam = sys.argv[3]
t0 = time.perf_counter()
for c in cmds:
    subprocess.run([tool, "-w"] + c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for name in os.listdir(ipam):
    if name[0].isdigit():
        os.unlink(os.path.join(ipam, name))
print(time.perf_counter() - t0)
"""


def status_once(sb: Sandbox, tmp: Path) -> dict:
    run = Runner(sb.host, sb.bin_dir)
    r = run(BINARY, cni_env("STATUS"), status_conf(tmp))
    run.close()
    assert r["rc"] == 0, r
    return r


def bench_sweep(flavour: str, n: int, driver: str, nomad_way: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="cni-reaper-bench-") as t:
        tmp = Path(t)
        res: dict = {"kind": f"iptables-{flavour}", "attachments": n}
        with Sandbox(tmp / "sb", flavour, str(BINARY), driver) as sb:
            plant(sb, tmp, n)
            before = count_cni_lines(sb)
            r = status_once(sb, tmp)
            left = count_cni_lines(sb)
            assert left == 0, f"{left} of {before} rules left"
            assert not list((tmp / "ipam" / NETWORK).glob("172.*")), "reservations left"
            res.update(rules=before, seconds=round(r["s"], 3), per_attachment_ms=round(r["s"] / n * 1000, 3),
                       peak_rss_mib=round(r["kib"] / 1024, 1))
        if nomad_way:
            with Sandbox(tmp / "sb2", flavour, str(BINARY), driver) as sb:
                cmds = plant(sb, tmp / "nw", n)
                (tmp / "cmds.json").write_text(json.dumps(cmds))
                (tmp / "nomadway.py").write_text(NOMAD_WAY)
                proc = sb.run([sys.executable, str(tmp / "nomadway.py"), str(tmp / "cmds.json"),
                               str(sb.bin_dir / "iptables"), str(tmp / "nw" / "ipam" / NETWORK)], timeout=3600)
                assert proc.returncode == 0, proc.stderr
                assert count_cni_lines(sb) == 0
                res["nomad_way_seconds"] = round(float(proc.stdout.strip()), 3)
                res["speedup"] = round(res["nomad_way_seconds"] / res["seconds"], 1)
        return res


def bench_native_sweep(n: int, driver: str) -> dict:
    """N dead attachments with their native nftables rules (5 each: masquerade, 2 DNAT, 2 hairpin)."""
    with tempfile.TemporaryDirectory(prefix="cni-reaper-bench-") as t:
        tmp = Path(t)
        with Sandbox(tmp / "sb", "nft", str(BINARY), driver) as sb:
            plant(sb, tmp, n, native=True)

            def owned() -> int:  # the attachments' rules; the tables' own hook and jump rules carry no comment
                return sum(1 for rule in sb.native_rules() if "comment" in rule)

            before = owned()
            r = status_once(sb, tmp)
            assert owned() == 0, f"{owned()} of {before} native rules left"
            return {"kind": "native nftables", "attachments": n, "rules": before, "seconds": round(r["s"], 3),
                    "per_attachment_ms": round(r["s"] / n * 1000, 3), "peak_rss_mib": round(r["kib"] / 1024, 1)}


# The release the sweeps are held to, measured in the same run: its commit, built the way it was built (its own
# scripts/bundle.py on the cached root file system) and swept by its own bench code (its records' schema)
REFERENCES = {"0.2.0": "c01a5d0337c2046f532fee624637a3e5a56af0bf", "0.4.0": "104b18b"}

SWEEP_PROBE = """
import json, os, sys
repo, kind, n, harness = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.path[:0] = [repo + "/plugin", repo + "/tests", repo + "/scripts"]
os.chdir(repo)
import bench
bench.HARNESS = harness  # main's: it also reports the CPU time of the call and of the tools it waited for
calls, status_once = [], bench.status_once
bench.status_once = lambda *a: calls.append(status_once(*a)) or calls[-1]
driver = bench.build_driver()
r = bench.bench_native_sweep(n, driver) if kind == "native" else bench.bench_sweep(kind, n, driver, False)
print(json.dumps(dict(r, cpu=calls[-1]["cpu"])))
"""


def reference_checkout(version: str) -> Path:
    """A worktree of release `version` under build/work with its bundle built (once)."""
    where = REPO / "build" / "work" / f"ref-{version}"
    if not (where / "dist" / "cni-reaper" / "cni-reaper").exists():
        if not (where / ".git").exists():
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--force", "--detach", str(where),
                            REFERENCES[version]], check=True, capture_output=True)
        (where / "build").mkdir(exist_ok=True)
        if not (where / "build" / "work").exists():
            (where / "build" / "work").symlink_to(REPO / "build" / "work")
        subprocess.run(["python3", "scripts/bundle.py"], cwd=where, check=True, capture_output=True)
    return where


def bench_against(version: str, kinds: list[str], n: int, rounds: int) -> dict:
    """Sweeps of `n` dead attachments by main and by release `version`, interleaved (which goes first swapped
    every other round), each with its own bench code: medians of `rounds` each, and the median of the rounds'
    ratios (main / the release)."""
    ref = reference_checkout(version)
    got: dict[str, dict[str, list[dict]]] = {k: {"main": [], version: []} for k in kinds}
    for i in range(rounds):
        for kind in kinds:
            for who, repo in (("main", REPO), (version, ref))[::1 if i % 2 == 0 else -1]:
                proc = subprocess.run([sys.executable, "-c", SWEEP_PROBE, str(repo), kind, str(n), HARNESS], text=True,
                                      capture_output=True, timeout=1800,
                                      env=dict(os.environ, PYTHONPATH=f"{repo}/plugin:{repo}/tests"))
                if proc.returncode != 0:
                    raise RuntimeError(f"sweep of {who} ({kind}) failed: {proc.stderr[-2000:]}")
                got[kind][who].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out = {}
    for kind, by in got.items():
        m, r = by["main"], by[version]
        out[kind] = {"main_s": round(statistics.median(x["seconds"] for x in m), 3),
                     f"{version}_s": round(statistics.median(x["seconds"] for x in r), 3),
                     "ratio": round(statistics.median(a["seconds"] / b["seconds"] for a, b in zip(m, r)), 3),
                     "main_cpu_s": round(statistics.median(x["cpu"] for x in m), 3),
                     f"{version}_cpu_s": round(statistics.median(x["cpu"] for x in r), 3),
                     "cpu_ratio": round(statistics.median(a["cpu"] / b["cpu"] for a, b in zip(m, r)), 3),
                     "rounds": {k: [round(x["seconds"], 3) for x in v] for k, v in by.items()}}
    return out


CONNTRACK_PROBE = """
import json, sys, time
from cni_reaper.reap import conntrack
ips = set(json.loads(sys.argv[1]))
t0 = time.perf_counter()
counts = conntrack.clear(ips)
print(json.dumps({"seconds": time.perf_counter() - t0, "entries": sum(counts.values()), "addresses": len(counts)}))
"""


def bench_conntrack(n: int, per_ip: int = 3) -> dict:
    """Conntrack clean-up for N dead IPs holding `per_ip` entries each, beside as many entries of live IPs."""
    with tempfile.TemporaryDirectory(prefix="cni-reaper-bench-") as t:
        tmp = Path(t)
        with Sandbox(tmp / "sb", "nft", str(BINARY)) as sb:
            dead = [ip_of(i) for i in range(n)]
            live = [ip_of(n + i, base="10.123") for i in range(n)]
            lines = []
            for k, ip in enumerate(dead + live):
                for j in range(per_ip):
                    lines.append(" ".join(conntrack_entry(ip, 1024 + k * per_ip + j)))
            (tmp / "ct.sh").write_text("\n".join(f"conntrack {l} >/dev/null 2>&1" for l in lines) + "\n")
            sb.run(["sh", str(tmp / "ct.sh")], timeout=600)
            total = sb.run(["conntrack", "-C"]).stdout.strip()
            proc = sb.run([sys.executable, "-c", CONNTRACK_PROBE, json.dumps(dead)], check=True)
            out = json.loads(proc.stdout)
            left = sb.run(["conntrack", "-C"]).stdout.strip()
            assert out["entries"] == n * per_ip and int(left) == n * per_ip, (out, total, left)
            return {"dead_ips": n, "entries_before": int(total), "entries_cleared": out["entries"],
                    "seconds": round(out["seconds"], 3)}


# -- the run ----------------------------------------------------------------------------------------
TARGETS = [
    ("ADD <= 0.5 x portmap ADD", lambda r, f: r["verbs"][f]["ratios"]["ADD / portmap ADD"] <= 0.5),
    ("ADD and DEL with nothing stale no slower than the last release's (paired rounds; --release '' skips it)",
     lambda r, f: all(v <= 1.0 for k, v in r["verbs"][f]["ratios"].items() if k.startswith(("ADD / 0", "DEL nothing stale / 0")))),
    ("DEL nothing stale <= 1.0 x portmap DEL (legacy), <= 0.5 x (nft)",
     lambda r, f: r["verbs"][f]["ratios"]["DEL nothing stale / portmap DEL"] <= (1.0 if f == "legacy" else 0.5)),
    ("1,000 live records add <= 5 ms to an ADD (side by side, 3 x pairs rounds)",
     lambda r, f: r["verbs"][f]["scale_ms"]["ADD with 1,000 live records - ADD, side by side"] <= 5),
    ("1,000 live records add <= 5 ms of CPU time to an ADD (the same calls)",
     lambda r, f: r["verbs"][f]["scale_ms"]["ADD with 1,000 live records - ADD, side by side, CPU time"] <= 5),
    ("chain ADD grows <= 15 %", lambda r, f: r["verbs"][f]["ratios"]["chain ADD share"] <= 0.15),
    ("`list --json` of 1,000 records no more than 100 ms slower than the last release's (paired rounds)",
     lambda r, f: all(v <= 100 for k, v in r["verbs"][f]["list_ms"].items() if k.startswith("list - release"))),
    ("the wrapper adds no more than cni-reaper chained last (ADD; portmap's stand-in, paired rounds)",
     lambda r, f: all(v <= 0 for k, v in r["verbs"][f]["wrap_alone_ms"].items() if k.startswith("ADD: "))),
    ("the wrapper adds no more than cni-reaper chained last (DEL, nothing stale; the stand-in, paired rounds)",
     lambda r, f: all(v <= 0 for k, v in r["verbs"][f]["wrap_alone_ms"].items() if k.startswith("DEL: "))),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    ap.add_argument("--scales", default="10,100,1000")
    ap.add_argument("--flavours", default=",".join(FLAVOURS))
    ap.add_argument("--nomad-way-max", type=int, default=1000, help="largest scale measured the per-rule way")
    ap.add_argument("--quick", action="store_true", help="7 pairs, scales 10,100, per-rule way up to 100")
    ap.add_argument("--against", default="0.2.0", help="the release whose 1,000-attachment sweeps main is held to, "
                    "in the same run ('' for none)")
    ap.add_argument("--against-rounds", type=int, default=5)
    ap.add_argument("--release", default="0.4.0", help="the release whose ADD and DEL with nothing stale run beside "
                    "main's in the same rounds ('' for none)")
    args = ap.parse_args()
    if args.quick:
        args.pairs, args.scales, args.nomad_way_max = 7, "10,100", 100
    if os.geteuid() != 0:
        print("bench: run as root (network namespaces)", file=sys.stderr)
        return 1
    driver = build_driver()
    release = None
    if args.release:
        print(f"the {args.release} bundle ...", flush=True)
        release = (args.release, reference_checkout(args.release) / "dist" / "cni-reaper" / "cni-reaper")
    scales = [int(x) for x in args.scales.split(",")]
    flavours = args.flavours.split(",")
    results: dict = {"machine": {"cores": os.cpu_count(), "kernel": os.uname().release}, "pairs": args.pairs}
    print("limits and floors ...", flush=True)
    results["limits"] = bench_limits(args.pairs)
    results["verbs"] = {}
    for flavour in flavours:
        print(f"verbs on iptables-{flavour}: {args.pairs} interleaved rounds ...", flush=True)
        results["verbs"][flavour] = bench_verbs(flavour, args.pairs, driver, release)
    results["sweeps"] = []
    for flavour in flavours:
        for n in scales:
            print(f"sweep: {n} dead attachments on iptables-{flavour} ...", flush=True)
            results["sweeps"].append(bench_sweep(flavour, n, driver, n <= args.nomad_way_max))
    print(f"sweep: {max(scales)} dead attachments in the native nftables tables ...", flush=True)
    results["sweeps"].append(bench_native_sweep(max(scales), driver))
    if args.against:
        print(f"sweeps of {max(scales)} by main and by {args.against}, interleaved ...", flush=True)
        results["against"] = {"version": args.against,
                              "sweeps": bench_against(args.against, [*flavours, "native"], max(scales),
                                                      args.against_rounds)}
    print(f"conntrack: {max(scales)} dead IPs ...", flush=True)
    results["conntrack"] = bench_conntrack(max(scales))
    results["targets"] = {f"{name} [{f}]": check(results, f) for name, check in TARGETS for f in flavours}
    for kind, a in results.get("against", {}).get("sweeps", {}).items():
        results["targets"][f"1,000-attachment sweeps no slower than {args.against} in the same run [{kind}]"] = \
            a["ratio"] <= 1.0
        results["targets"][f"1,000-attachment sweeps take no more CPU than {args.against}'s in the same run [{kind}]"] = \
            a["cpu_ratio"] <= 1.0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    report(results)
    print(f"\nwritten to {out}")
    return 0


def report(r: dict) -> None:
    print(f"\n== limits and floors (ms, medians of {r['pairs']})")
    for name, ms in r["limits"].items():
        print(f"  {name:<48} {ms:>8.2f}")
    for flavour, v in r["verbs"].items():
        print(f"\n== verbs on iptables-{flavour} (ms, medians; Nomad's shape: one port, tcp and udp)")
        for name, ms in v["medians_ms"].items():
            print(f"  {name:<48} {ms:>8.2f}   peak {v['peak_rss_mib'][name]:>5.1f} MiB")
        print(f"  {'bridge chain ADD via go-cni, with cni-reaper':<48} {v['chain_ms']['with cni-reaper']:>8.2f}")
        print(f"  {'bridge chain ADD via go-cni, with the floor':<48} {v['chain_ms']['with the floor']:>8.2f}")
        print(f"  {'bridge chain ADD via go-cni, without':<48} {v['chain_ms']['without']:>8.2f}")
        for name, ms in v["wrap_ms"].items():
            print(f"  {'Nomad bridge network ' + name:<48} {ms:>8.2f}")
        for name, ms in v["wrap_alone_ms"].items():
            print(f"  {'portmap stand-in, ' + name:<48} {ms:>8.2f}")
        j = v["journal_ms"]
        print(f"  {'journal of a cleaning DEL':<48} {j['per cleaning DEL']:>8.2f}   "
              f"({j['lines per cleaning DEL']} lines, {j['bytes per cleaning DEL']} bytes)")
        print("  ratios: " + ", ".join(f"{k} {val}" for k, val in v["ratios"].items()))
        print("  " + ", ".join(f"{k} (ms) {val}" for k, val in v["scale_ms"].items()))
        print("  " + ", ".join(f"{k} {val}" for k, val in v["list_ms"].items()))
        print("  stages of cni-reaper's ADD (ms): " + ", ".join(f"{k} {val}" for k, val in v["stages_ms"].items()))
    print("\n== sweeps of dead attachments (iptables: masquerade chain+jump, DNAT chain+2 jumps, 2 firewall rules, "
          "1 reservation each; native: 5 rules, 1 reservation each)")
    print(f"  {'kind':<18} {'N':>5} {'rules':>6} {'seconds':>8} {'ms/att':>7} {'MiB':>5} {'per-rule way s':>15} {'speedup':>8}")
    for s in r["sweeps"]:
        print(f"  {s['kind']:<18} {s['attachments']:>5} {s['rules']:>6} {s['seconds']:>8.3f} {s['per_attachment_ms']:>7.2f} "
              f"{s['peak_rss_mib']:>5.1f} {s.get('nomad_way_seconds', float('nan')):>15.2f} {s.get('speedup', float('nan')):>8.1f}")
    if "against" in r:
        v = r["against"]["version"]
        print(f"\n== sweeps of 1,000 dead attachments, main and {v} in the same run (interleaved, medians)")
        for kind, a in r["against"]["sweeps"].items():
            print(f"  {kind:<8} main {a['main_s']:.3f} s, {v} {a[v + '_s']:.3f} s, main / {v} {a['ratio']:.2f}; "
                  f"CPU (the call and its tools) main {a['main_cpu_s']:.3f} s, {v} {a[v + '_cpu_s']:.3f} s, "
                  f"main / {v} {a['cpu_ratio']:.2f}   (rounds, s: {a['rounds']})")
    c = r["conntrack"]
    print(f"\n== conntrack: {c['entries_cleared']} entries of {c['dead_ips']} dead IPs cleared in {c['seconds']} s "
          f"({c['entries_before']} entries in the table)")
    print("\n== targets")
    for name, ok in r["targets"].items():
        print(f"  {'met    ' if ok else 'NOT met'} {name}")


if __name__ == "__main__":
    sys.exit(main())
