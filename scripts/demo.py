"""The cni-reaper demo: two Nomad-style allocations through the shipped conflist, driven by containerd's
go-cni (the library Nomad uses) with the real reference plugins and the built cni-reaper binary, all inside
a throwaway "host" network namespace. Nothing on this machine's own tables is touched.

Run by scripts/demo.sh after set-up and build.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from testkit.sandbox import Sandbox, build_driver


def say(text: str) -> None:
    print(f"\n== {text}")


def show_records(sb: Sandbox) -> None:
    rows = [("NETWORK", "CONTAINER ID", "IFNAME", "IPS", "PORTS", "NETNS", "STATE", "EARLIER")]
    for r in sb.records():
        cur = r["current"]
        ports = ",".join(f"{p['hostPort']}->{p['containerPort']}/{p['protocol']}" for p in cur["portMappings"])
        ips = ",".join(f"{i['address']}/{i['prefix']}" for i in cur["ips"])
        rows.append((r["network"], r["containerID"], r["ifname"], ips, ports or "-", cur["netns"],
                     "torn down" if r["deleted"] else "live", str(len(r["earlier"]))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)))


def residue(sb: Sandbox, cid: str, ip: str) -> list[str]:
    text = sb.save(table="nat") + sb.save(table="filter")
    return [l for l in text.splitlines() if cid in l or f"{ip}/32" in l or f"{ip}:" in l]


def main() -> int:
    binary = REPO / "dist" / "cni-reaper" / "cni-reaper"
    if not binary.exists():
        print("build the binary first: scripts/build.sh", file=sys.stderr)
        return 1
    driver = build_driver()
    with tempfile.TemporaryDirectory(prefix="cni-reaper-demo-") as tmp, \
            Sandbox(Path(tmp), "nft", str(binary), driver) as sb:
        conflist = sb.conflist()
        say(f"throwaway host netns {sb.host}; conflist {conflist.name}: loopback, bridge, firewall, portmap, cni-reaper")
        allocs = {}
        for cid, port in (("3e803d29-4f9d-ad8b-adb6-31456a39db69", "8080"), ("9b1c5a77-0d2e-4c1f-8a3b-6f2e1d0c9a88", "8081")):
            netns = sb.container()
            proc = sb.driver("add", cid, netns, ports=(f"{port}:80/tcp", f"{port}:80/udp"),
                             args=("IgnoreUnknown=true", f"NOMAD_ALLOC_ID={cid}"))
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            ip = json.loads(proc.stdout)[-1]["ips"][0]["address"].split("/")[0]
            allocs[cid] = (netns, port, ip)
            say(f"ADD {cid} (netns {netns}, {ip}, host port {port}) through go-cni: ok")
        say("records in the state directory")
        show_records(sb)

        (cid, (netns, port, ip)), (cid_b, (netns_b, port_b, ip_b)) = allocs.items()
        say(f"the Nomad client goes down; {cid}'s netns is removed; the client comes back and stops it (DEL)")
        sb.remove_container(netns)
        proc = sb.driver("del", cid, netns, ports=(f"{port}:80/tcp", f"{port}:80/udp"))
        print(f"  DEL exit status: {proc.returncode}")
        for line in proc.stderr.splitlines():
            if '"removed"' in line:
                print("  log: " + line)
        left = residue(sb, cid, ip)
        say(f"what is left of {cid} ({len(left)} netfilter lines; the reference plugins alone leave 3 here)")
        for line in left:
            print("  " + line)
        show_records(sb)

        say(f"{cid_b}'s netns vanishes and no DEL ever comes; a new allocation asks for the same host port {port_b}")
        sb.remove_container(netns_b)
        new = "5d2c7e10-8a41-4b6e-9c3f-0e1d2a3b4c5d"
        netns_c = sb.container()
        proc = sb.driver("add", new, netns_c, ports=(f"{port_b}:80/tcp", f"{port_b}:80/udp"))
        print(f"  ADD exit status: {proc.returncode}; left of {cid_b}: {len(residue(sb, cid_b, ip_b))} netfilter lines")
        server = sb.serve(netns_c, 80, f"hello from {new[:8]}")
        try:
            answer = ""
            for _ in range(20):
                answer = sb.connect("172.26.64.1", int(port_b))
                if not answer.startswith("refused"):
                    break
            print(f"  TCP connect to the host port {port_b} answers: {answer!r}")
        finally:
            server.kill()
        show_records(sb)
        say(f"state directory: {sb.state_dir()} (inside the sandbox: /var/lib/cni/reaper)")
    say("sandbox removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
