"""cni-reaper benchmarks (run by scripts/bench.sh). Every measurement runs in throwaway network namespaces.

Anchors measured in the same run: the Go `portmap` plugin (the peer) and the floor (a one-folder PyInstaller
bundle of a program that only passes prevResult through, built like cni-reaper). Pairs are interleaved
(A B A B ...) and medians compared, so that machine noise hits both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from testkit.artifacts import ip_of, leak, restore_text, write_records, write_reservations
from testkit.sandbox import Sandbox, build_driver, unique

BINARY = REPO / "dist" / "cni-reaper" / "cni-reaper"
FLOOR = REPO / "dist" / "floor" / "floor"
PORTMAP = "/usr/lib/cni/portmap"
NETWORK = "bench"


# -- running one plugin call, timed --------------------------------------------------------------------
HARNESS = r"""
import json, os, sys, time
for line in sys.stdin:
    job = json.loads(line)
    r, w = os.pipe()
    o_r, o_w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.dup2(r, 0); os.dup2(o_w, 1)
        devnull = os.open("/dev/null", os.O_WRONLY); os.dup2(devnull, 2)
        os.close(w); os.close(o_r)
        os.execve(job["exe"], [job["exe"]], job["env"])
    os.close(r); os.close(o_w)
    os.write(w, job["stdin"].encode()); os.close(w)
    chunks = []
    while True:
        b = os.read(o_r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(o_r)
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.perf_counter() - t0
    sys.stdout.write(json.dumps({"s": elapsed, "rc": os.waitstatus_to_exitcode(status), "kib": usage.ru_maxrss,
                                 "out": b"".join(chunks).decode()}) + "\n")
    sys.stdout.flush()
"""


class Runner:
    """Runs plugin calls from inside a netns the way a runtime does (fork and exec, env and stdin), so that
    `ip netns exec`'s own cost (a mount namespace, a /sys remount) is in no measurement. Peak RSS comes
    from wait4 on the plugin process itself."""

    def __init__(self, host: str, bin_dir: Path) -> None:
        self.path = f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
        self.proc = subprocess.Popen(["ip", "netns", "exec", host, sys.executable, "-c", HARNESS],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, exe: str, env: dict[str, str], stdin: str) -> tuple[float, int, int, str]:
        self.proc.stdin.write(json.dumps({"exe": exe, "env": {"PATH": self.path, **env}, "stdin": stdin}) + "\n")
        self.proc.stdin.flush()
        r = json.loads(self.proc.stdout.readline())
        return r["s"], r["kib"], r["rc"], r["out"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def cni_env(command: str, cid: str = "", netns: str = "", ifname: str = "eth0") -> dict[str, str]:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
            "CNI_PATH": "/usr/lib/cni"}


def conf(tmp: Path, ip: str, port: int, version: str = "1.0.0", netns: str = "") -> str:
    return json.dumps({
        "cniVersion": version, "name": NETWORK, "type": "bench", "snat": True,
        "stateDir": str(tmp / "state"), "ipamDataDir": str(tmp / "ipam"), "cniCacheDir": str(tmp / "cache"),
        "logFile": "",
        "runtimeConfig": {"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"},
                                           {"hostPort": port, "containerPort": 80, "protocol": "udp"}]},
        "prevResult": {"cniVersion": version, "interfaces": [{"name": "eth0", "sandbox": netns}],
                       "ips": [{"address": f"{ip}/16", "interface": 0, "gateway": "172.26.0.1"}]},
    })


def median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 2)


def plant(sb: Sandbox, tmp: Path, n: int, live_netns: str | None = None) -> list[list[str]]:
    """N attachments' leftovers in the sandbox's tables, N records (dead, or live on `live_netns`) and N
    host-local reservations. Returns the per-rule removal commands (Nomad's way)."""
    nat, filt, cmds = [], [], []
    items = []
    for i in range(n):
        cid, ip, port = f"dead-{i:05d}", ip_of(i), 20000 + i
        items.append((cid, ip, port, live_netns or f"/var/run/netns/bench-gone-{i}"))
        if live_netns is None:
            a, b, c = leak(NETWORK, cid, ip, port)
            nat += a
            filt += b
            cmds += c
    write_records(tmp / "state", NETWORK, items)
    if live_netns is None:
        write_reservations(tmp / "ipam", NETWORK, [(cid, ip) for cid, ip, _, _ in items])
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


# -- the measurements -----------------------------------------------------------------------------------
def bench_verbs(pairs: int, driver: str) -> dict:
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="cni-reaper-bench-") as t:
        tmp = Path(t)
        with Sandbox(tmp / "sb", "nft", str(BINARY), driver) as sb:
            run = Runner(sb.host, sb.bin_dir)
            live = sb.container()
            samples: dict[str, list[float]] = {k: [] for k in (
                "reaper_add", "portmap_add", "floor", "reaper_del", "portmap_del", "reaper_del_dead",
                "chain_add_with", "chain_add_without")}
            rss: dict[str, int] = {}
            for i in range(pairs):
                cid, ip, port = f"alloc-{i}", ip_of(i), 30000 + i
                c = conf(tmp, ip, port, netns=live)
                order = [("reaper_add", str(BINARY), cni_env("ADD", cid, live)),
                         ("portmap_add", PORTMAP, cni_env("ADD", cid, live)),
                         ("floor", str(FLOOR), cni_env("ADD", cid, live))]
                if i % 2:
                    order.reverse()
                for name, exe, env in order:
                    secs, kib, rc, _ = run(exe, env, c)
                    assert rc == 0, (name, rc)
                    samples[name].append(secs)
                    rss[name] = max(rss.get(name, 0), kib)
                order = [("reaper_del", str(BINARY)), ("portmap_del", PORTMAP)]
                if i % 2:
                    order.reverse()
                for name, exe in order:
                    secs, kib, rc, _ = run(exe, cni_env("DEL", cid, live), c)
                    assert rc == 0, (name, rc)
                    samples[name].append(secs)
                    rss[name] = max(rss.get(name, 0), kib)
                # DEL that must clean one dead attachment: its netns is gone
                gone = sb.container()
                dcid, dip = f"dead-{i}", ip_of(pairs + i)
                dconf = conf(tmp, dip, 31000 + i, netns=gone)
                assert run(str(BINARY), cni_env("ADD", dcid, gone), dconf)[2] == 0
                nat, filt, _ = leak(NETWORK, dcid, dip, 31000 + i)
                sb.run([str(sb.bin_dir / "iptables-restore"), "--noflush"], input=restore_text(nat, filt), check=True)
                sb.remove_container(gone)
                secs, kib, rc, _ = run(str(BINARY), cni_env("DEL", dcid, gone), dconf)
                assert rc == 0
                assert f'id: \\"{dcid}\\"' not in sb.save(4, "nat"), "the dead attachment was not cleaned"
                samples["reaper_del_dead"].append(secs)
                rss["reaper_del_dead"] = max(rss.get("reaper_del_dead", 0), kib)
                # settle: the sweep after a cleaning DEL looks at the tables once more; keep that out of the
                # next iteration's ADD (it is measured below as part of the sweep figures)
                run(str(BINARY), cni_env("STATUS"), json.dumps({**json.loads(dconf), "cniVersion": "1.1.0"}))
            run.close()
            # the whole Nomad bridge chain through go-cni, with and without cni-reaper appended
            with_reaper, without = sb.conflist(), sb.conflist(without_reaper=True)
            for i in range(pairs):
                order = [("chain_add_with", with_reaper), ("chain_add_without", without)]
                if i % 2:
                    order.reverse()
                for name, cl in order:
                    netns = sb.container()
                    cid = unique("chain-")
                    t0 = time.perf_counter()
                    proc = sb.driver("add", cid, netns, ("8080:80/tcp", "8080:80/udp"), cl)
                    samples[name].append(time.perf_counter() - t0)
                    assert proc.returncode == 0, proc.stderr
                    sb.driver("del", cid, netns, ("8080:80/tcp", "8080:80/udp"), cl)
                    sb.remove_container(netns)
    med = {k: median_ms(v) for k, v in samples.items()}
    out["medians_ms"] = med
    out["peak_rss_kib"] = rss
    out["ratios"] = {
        "add_vs_floor": round(med["reaper_add"] / med["floor"], 3),
        "add_vs_portmap_add": round(med["reaper_add"] / med["portmap_add"], 3),
        "floor_vs_portmap_add": round(med["floor"] / med["portmap_add"], 3),
        "del_vs_floor": round(med["reaper_del"] / med["floor"], 3),
        "del_dead_vs_floor_plus_portmap_del": round(med["reaper_del_dead"] / (med["floor"] + med["portmap_del"]), 3),
        "chain_add_share": round(med["chain_add_with"] / med["chain_add_without"] - 1, 3),
    }
    out["pairs"] = pairs
    return out


def bench_sweep(flavour: str, n: int, driver: str, nomad_way: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="cni-reaper-bench-") as t:
        tmp = Path(t)
        res: dict = {"flavour": flavour, "attachments": n}
        with Sandbox(tmp / "sb", flavour, str(BINARY), driver) as sb:
            plant(sb, tmp, n)
            before = count_cni_lines(sb)
            status = json.dumps({"cniVersion": "1.1.0", "name": NETWORK, "type": "cni-reaper",
                                 "stateDir": str(tmp / "state"), "ipamDataDir": str(tmp / "ipam"),
                                 "cniCacheDir": str(tmp / "cache"), "logFile": ""})
            run = Runner(sb.host, sb.bin_dir)
            secs, kib, rc, _ = run(str(BINARY), cni_env("STATUS"), status)
            run.close()
            left = count_cni_lines(sb)
            assert rc == 0 and left == 0, f"{left} of {before} rules left"
            assert not list((tmp / "ipam" / NETWORK).glob("172.*")), "reservations left"
            res.update(rules=before, seconds=round(secs, 3), per_attachment_ms=round(secs / n * 1000, 3), peak_rss_kib=kib)
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
                res["nomad_way_processes"] = len(cmds)
                res["speedup"] = round(res["nomad_way_seconds"] / res["seconds"], 1)
        return res


def bench_nothing_stale(pairs: int, n: int, driver: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="cni-reaper-bench-") as t:
        tmp = Path(t)
        with Sandbox(tmp / "sb", "nft", str(BINARY), driver) as sb:
            live = sb.container()
            plant(sb, tmp / "full", n, live_netns=live)
            (tmp / "empty" / "state").mkdir(parents=True)
            samples: dict[str, list[float]] = {"empty": [], "full": []}
            run = Runner(sb.host, sb.bin_dir)
            for i in range(pairs):
                for name in (("empty", "full") if i % 2 == 0 else ("full", "empty")):
                    status = json.dumps({"cniVersion": "1.1.0", "name": NETWORK, "type": "cni-reaper",
                                         "stateDir": str(tmp / name / "state"), "logFile": "",
                                         "cniCacheDir": str(tmp / "cache"), "ipamDataDir": str(tmp / "ipam")})
                    secs, _, rc, _ = run(str(BINARY), cni_env("STATUS"), status)
                    assert rc == 0
                    samples[name].append(secs)
            run.close()
            return {"records": n, "status_empty_ms": median_ms(samples["empty"]),
                    "status_1000_live_ms": median_ms(samples["full"]),
                    "extra_ms": round(median_ms(samples["full"]) - median_ms(samples["empty"]), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    ap.add_argument("--scales", default="10,100,1000")
    ap.add_argument("--flavours", default="nft,legacy")
    ap.add_argument("--nomad-way-max", type=int, default=1000, help="largest scale measured the per-rule way")
    ap.add_argument("--quick", action="store_true", help="5 pairs, scales 10,100, per-rule way up to 100")
    args = ap.parse_args()
    if args.quick:
        args.pairs, args.scales, args.nomad_way_max = 5, "10,100", 100
    if os.geteuid() != 0:
        print("bench: run as root (network namespaces)", file=sys.stderr)
        return 1
    driver = build_driver()
    results: dict = {"machine": {"cores": os.cpu_count(), "kernel": os.uname().release}}
    print(f"verbs: {args.pairs} interleaved pairs ...", flush=True)
    results["verbs"] = bench_verbs(args.pairs, driver)
    results["sweep"] = []
    for flavour in args.flavours.split(","):
        for n in (int(x) for x in args.scales.split(",")):
            print(f"sweep: {n} dead attachments on iptables-{flavour} ...", flush=True)
            results["sweep"].append(bench_sweep(flavour, n, driver, n <= args.nomad_way_max))
    print("sweep with nothing stale, 1000 live records ...", flush=True)
    results["nothing_stale"] = bench_nothing_stale(args.pairs, 1000, driver)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print_report(results)
    print(f"\nwritten to {out}")
    return 0


def print_report(r: dict) -> None:
    v = r["verbs"]
    m, ratio = v["medians_ms"], v["ratios"]
    print(f"\n== verbs (medians of {v['pairs']} interleaved pairs, ms)")
    rows = [("cni-reaper ADD", m["reaper_add"]), ("portmap ADD", m["portmap_add"]), ("floor (pass-through bundle)", m["floor"]),
            ("cni-reaper DEL, nothing stale", m["reaper_del"]), ("portmap DEL", m["portmap_del"]),
            ("cni-reaper DEL cleaning one dead attachment", m["reaper_del_dead"]),
            ("bridge chain ADD via go-cni, with cni-reaper", m["chain_add_with"]),
            ("bridge chain ADD via go-cni, without", m["chain_add_without"])]
    for name, ms in rows:
        print(f"  {name:<48} {ms:>8.1f}")
    print("  ratios: " + ", ".join(f"{k} {val}" for k, val in ratio.items()))
    print("  peak RSS (MiB): " + ", ".join(f"{k} {kib / 1024:.1f}" for k, kib in v["peak_rss_kib"].items()))
    print("\n== sweep of dead attachments (each: masquerade chain+jump, DNAT chain+2 jumps, 2 firewall rules, 1 reservation)")
    print(f"  {'flavour':<8} {'N':>5} {'rules':>6} {'seconds':>8} {'ms/att':>7} {'MiB':>5} {'per-rule way s':>15} {'speedup':>8}")
    for s in r["sweep"]:
        print(f"  {s['flavour']:<8} {s['attachments']:>5} {s['rules']:>6} {s['seconds']:>8.3f} {s['per_attachment_ms']:>7.2f} "
              f"{s['peak_rss_kib'] / 1024:>5.1f} {s.get('nomad_way_seconds', float('nan')):>15.2f} {s.get('speedup', float('nan')):>8.1f}")
    ns = r["nothing_stale"]
    print(f"\n== nothing stale: STATUS with {ns['records']} live records {ns['status_1000_live_ms']} ms, "
          f"with none {ns['status_empty_ms']} ms: {ns['extra_ms']} ms of sweep work")


if __name__ == "__main__":
    sys.exit(main())
