"""What the reference plugins leave in netfilter and host-local for one attachment (the shapes of docs/how-it-works.md,
"What a dead attachment leaves", as measured on the real plugins), planted directly: for the benchmark's and the reliability tests' thousands of
attachments, where running the real chain for each would take minutes. The end-to-end tests use the real
plugins instead."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def chain(prefix: str, network: str, cid: str) -> str:
    return ("CNI-" + prefix + hashlib.sha512((network + cid).encode()).hexdigest())[:28]


def ip_of(i: int, base: str = "172.26") -> str:
    return f"{base}.{(i + 2) // 250 + 1}.{(i + 2) % 250 + 2}"


def leak(network: str, cid: str, ip: str, port: int) -> tuple[list[str], list[str], list[list[str]]]:
    """(nat lines, filter lines, the per-rule iptables commands that remove them one process each)."""
    m, d = chain("", network, cid), chain("DN-", network, cid)
    host = f"{ip}/128" if ":" in ip else f"{ip}/32"  # how iptables-save prints a host address
    to = f"[{ip}]:80" if ":" in ip else f"{ip}:80"
    tag = f'name: \\"{network}\\" id: \\"{cid}\\"'
    dtag = f'dnat name: \\"{network}\\" id: \\"{cid}\\"'
    nat = [f":{m} - [0:0]", f":{d} - [0:0]",
           f'-A POSTROUTING -s {host} -m comment --comment "{tag}" -j {m}',
           f'-A {m} -d 172.26.0.0/16 -m comment --comment "{tag}" -j ACCEPT',
           f'-A {m} ! -d 224.0.0.0/4 -m comment --comment "{tag}" -j MASQUERADE']
    for proto in ("tcp", "udp"):
        nat += [f'-A CNI-HOSTPORT-DNAT -p {proto} -m comment --comment "{dtag}" -m multiport --dports {port} -j {d}',
                f"-A {d} -s 172.26.0.0/16 -p {proto} -m {proto} --dport {port} -j CNI-HOSTPORT-SETMARK",
                f"-A {d} -p {proto} -m {proto} --dport {port} -j DNAT --to-destination {to}"]
    filt = [f"-A CNI-FORWARD -d {host} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            f"-A CNI-FORWARD -s {host} -j ACCEPT"]
    plain_tag, plain_dtag = f'name: "{network}" id: "{cid}"', f'dnat name: "{network}" id: "{cid}"'
    cmds = [["-t", "nat", "-D", "POSTROUTING", "-s", host, "-m", "comment", "--comment", plain_tag, "-j", m],
            ["-t", "nat", "-F", m], ["-t", "nat", "-X", m]]
    for proto in ("tcp", "udp"):
        cmds.append(["-t", "nat", "-D", "CNI-HOSTPORT-DNAT", "-p", proto, "-m", "comment", "--comment", plain_dtag,
                     "-m", "multiport", "--dports", str(port), "-j", d])
    cmds += [["-t", "nat", "-F", d], ["-t", "nat", "-X", d],
             ["-t", "filter", "-D", "CNI-FORWARD", "-d", host, "-m", "conntrack", "--ctstate",
              "RELATED,ESTABLISHED", "-j", "ACCEPT"],
             ["-t", "filter", "-D", "CNI-FORWARD", "-s", host, "-j", "ACCEPT"]]
    return nat, filt, cmds


SHARED_NAT = [":CNI-HOSTPORT-DNAT - [0:0]", ":CNI-HOSTPORT-SETMARK - [0:0]"]
SHARED_FILTER = [":CNI-FORWARD - [0:0]"]


def restore_text(nat: list[str], filt: list[str]) -> str:
    return "*nat\n" + "\n".join(SHARED_NAT + nat) + "\nCOMMIT\n*filter\n" + "\n".join(SHARED_FILTER + filt) + "\nCOMMIT\n"


def write_records(sb, network: str, items: list[tuple[str, str, int, str]], state_dir: Path | None = None,
                  ipam_dir: Path | None = None, ipam_seen_as: str | None = None) -> None:
    """One record per (container ID, ip, host port, netns path) through the plugin's own store, with the
    evidence an ADD in sandbox `sb`'s host would have recorded: the namespace and its directory, the host
    (this boot, the sandbox's host netns) and, where it is planted already, the address's reservation."""
    from cni_reaper.reap import probes
    from cni_reaper.state.record import HostId, RecordedIP, RecordedPortMapping, RecordSettings, life, merge
    from cni_reaper.state.store import Store

    h = probes.host()
    assert h.boot is not None and h.mnt is not None
    host = HostId(h.boot, h.machine, os.stat(f"/var/run/netns/{sb.host}").st_ino, h.mnt)
    ipam_dir = ipam_dir or sb.cni_dir / "networks"
    seen_as = ipam_seen_as or ("/var/lib/cni/networks" if ipam_dir == sb.cni_dir / "networks" else str(ipam_dir))
    store = Store(str(state_dir or sb.state_dir())).open()
    try:
        with store.locked():
            for cid, ip, port, netns in items:
                observed = probes.observe_life(netns, []).replace(host=host, veth=None)
                found = probes.find_reservation([str(ipam_dir)], network, ip, cid, "eth0")
                if found is not None:
                    found = found.replace(data_dir=seen_as)  # as the plugin sees it (the sandbox's /var/lib/cni is a mount)
                inc = life(observed, [RecordedIP(ip, 16, 4, found)], [RecordedPortMapping(port, 80, "tcp", "")])
                record, _ = merge(None, network, cid, "eth0", inc, {}, RecordSettings(seen_as, "/var/lib/cni", "auto"))
                store.save(record)
    finally:
        store.close()


def write_reservations(ipam_dir: Path, network: str, items: list[tuple[str, str]]) -> None:
    d = ipam_dir / network
    d.mkdir(parents=True, exist_ok=True)
    for cid, ip in items:
        (d / ip).write_text(f"{cid}\r\neth0")


# -- native nftables (plugins 1.6+) and conntrack -------------------------------------------------------
NATIVE_SETUP = """table inet cni_plugins_masquerade {
  chain masq_checks { }
  chain postrouting { type nat hook postrouting priority srcnat; policy accept; goto masq_checks; }
}
table ip cni_hostport {
  chain hostports { }
  chain hostip_hostports { }
  chain hostports_all { jump hostip_hostports; jump hostports; }
  chain prerouting { type nat hook prerouting priority dstnat; policy accept; fib daddr type local jump hostports_all; }
  chain masquerading { type nat hook postrouting priority srcnat; policy accept; }
}
"""


def native_leak(network: str, cid: str, ip: str, port: int, ifname: str = "eth0", subnet: str = "172.26.0.0/16") -> list[str]:
    """`nft -f` lines for what bridge (ipMasqBackend nftables) and portmap (backend nftables) make for one
    IPv4 attachment, with the comments they write."""
    from cni_reaper.reap.netfilter.nftables.rules import masq_hash

    comment = f"{masq_hash(network, ifname, cid)}, net: {network}, if: {ifname}, id: {cid}"
    return [f'add rule inet cni_plugins_masquerade masq_checks ip saddr {ip} ip daddr != {subnet} masquerade comment "{comment}"',
            f'add rule ip cni_hostport hostports tcp dport {port} dnat to {ip}:80 comment "{cid}"',
            f'add rule ip cni_hostport hostports udp dport {port} dnat to {ip}:80 comment "{cid}"',
            f'add rule ip cni_hostport masquerading ip saddr {ip} ip daddr {ip} masquerade comment "{cid}"',
            f'add rule ip cni_hostport masquerading ip saddr 127.0.0.1 ip daddr {ip} masquerade comment "{cid}"']


def conntrack_entry(reply_src: str, port: int) -> list[str]:
    """`conntrack -I` arguments for a UDP flow from a client to a host port, DNATed to `reply_src`."""
    return ["-I", "-p", "udp", "-s", "192.0.2.1", "-d", "198.51.100.1", "--sport", str(port), "--dport", "53",
            "-r", reply_src, "-q", "192.0.2.1", "--reply-port-src", "53", "--reply-port-dst", str(port), "-t", "300"]
