"""The safety property, randomized (seeded, reproducible): iptables and the plugins' native nftables tables
holding live attachments, dead ones, other networks, tagged attachments cni-reaper never recorded,
Docker-style chains, user rules and look-alikes, and conntrack entries of all of them. After a verb, exactly
the dead attachments' artifacts and entries are gone and every other line and entry is identical (counters
ignored). Both flavours. CNI_REAPER_SAFETY_SEEDS sets how many layouts (8 by default)."""

from __future__ import annotations

import json
import os
import random
import re

import pytest

from cni_reaper.reap.netfilter.nftables.rules import masq_hash
from testkit.artifacts import (
    NATIVE_SETUP,
    chain,
    conntrack_entry,
    leak,
    native_leak,
    restore_text,
    write_records,
    write_reservations,
)
from testkit.sandbox import Sandbox

pytestmark = pytest.mark.netns
SEEDS = int(os.environ.get("CNI_REAPER_SAFETY_SEEDS", "8"))
NET = "nomad-reaper"


def layout(sb: Sandbox, rng: random.Random, seed: int):
    live_ns = [sb.container() for _ in range(rng.randint(1, 2))]
    ips = iter(f"172.26.{rng.randint(1, 200)}.{i}" for i in rng.sample(range(2, 250), 60))
    ports = iter(rng.sample(range(20000, 30000), 60))
    live = [(f"live-{seed}-{k}", next(ips), next(ports), rng.choice(live_ns)) for k in range(rng.randint(1, 5))]
    dead = [(f"dead-{seed}-{k}", next(ips), next(ports), f"/var/run/netns/gone-{seed}-{k}") for k in range(rng.randint(1, 6))]
    orphans = [(f"orphan-{seed}-{k}", next(ips), next(ports)) for k in range(rng.randint(0, 2))]
    other = [(f"other-{seed}-{k}", next(ips), next(ports)) for k in range(rng.randint(0, 3))]
    nat, filt = [], []
    for cid, ip, port, _ in live + dead:
        a, b, _ = leak(NET, cid, ip, port)
        nat += a
        filt += b
    for cid, ip, port in orphans:
        a, b, _ = leak(NET, cid, ip, port)
        nat += a
        filt += b
    for cid, ip, port in other:
        a, b, _ = leak("other-net", cid, ip, port)
        nat += a
        filt += b
    victim = rng.choice(dead)
    lookalikes_nat = [
        ":DOCKER - [0:0]", "-A DOCKER -i docker0 -j RETURN", "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
        f":CNI-{rng.getrandbits(96):024x} - [0:0]",
        f'-A POSTROUTING -s {victim[1]}/32 -m comment --comment "copy of name: \\"{NET}\\" id: \\"{victim[0]}\\"" -j MASQUERADE',
        f"-A POSTROUTING -s 10.{rng.randint(0, 255)}.0.0/16 -j MASQUERADE",
    ]
    lookalikes_filter = ["-A DOCKER-USER -j RETURN", "-A FORWARD -j DOCKER-USER",
                         f"-A CNI-FORWARD -s {victim[1]}/32 -i eth9 -j ACCEPT"]
    rng.shuffle(lookalikes_filter)  # the look-alike firewall rule lands before, between or after the real ones
    filt.insert(rng.randint(0, len(filt)), lookalikes_filter.pop())
    text = restore_text(nat + lookalikes_nat, [":DOCKER-USER - [0:0]"] + filt + lookalikes_filter)
    sb.run([str(sb.bin_dir / "iptables-restore"), "--noflush"], input=text, check=True)
    # the same attachments in the plugins' native tables (some hosts run both), look-alikes among them
    native = [NATIVE_SETUP, "add table ip users", "add chain ip users c"]
    for cid, ip, port, *_ in live + dead + orphans:
        native += native_leak(NET, cid, ip, port + 10000)
    for cid, ip, port in other:
        native += native_leak("other-net", cid, ip, port + 10000)
    live_ip = live[0][1]
    native += [  # a comment naming the victim without its hash; the victim's ID on a rule to a live IP
        f'add rule inet cni_plugins_masquerade masq_checks ip saddr {victim[1]} masquerade comment "net: {NET}, if: eth0, id: {victim[0]}"',
        f'add rule ip cni_hostport hostports tcp dport 65000 dnat to {live_ip}:80 comment "{victim[0]}"',
        f'add rule ip cni_hostport hostports tcp dport 65001 dnat to {victim[1]}:80 comment "someone-else"',
        f'add rule ip users c ip saddr {victim[1]} counter comment "{victim[0]}"']
    rules = native[3:]
    rng.shuffle(rules)  # the look-alikes land before, between and after the real rules
    native = native[:3] + rules
    sb.run(["nft", "-f", "-"], input="\n".join(native) + "\n", check=True)
    for _cid, ip, port, *_ in live + dead + orphans:
        sb.run(["conntrack", *conntrack_entry(ip, port)], check=True)
    sb.run(["conntrack", *conntrack_entry("10.200.0.9", 1)], check=True)  # nobody's
    write_reservations(sb.cni_dir / "networks", NET, [(c, ip) for c, ip, _, _ in live + dead] + [(c, ip) for c, ip, _ in orphans])
    write_records(sb, NET, live + dead)
    return live, dead, orphans, live_ns


def native_owned(rule: str, cid: str, ip: str) -> bool:
    """A line of Sandbox.native_rules() that the plugins made for (NET, cid) with address ip."""
    has_ip = re.search(rf"(?<![\d.]){re.escape(ip)}(?![\d])", rule) is not None
    if " masq_checks: " in rule:
        return has_ip and f'comment "{masq_hash(NET, "eth0", cid)},' in rule
    return has_ip and rule.endswith(f'comment "{cid}"')


def dead_lines(sb: Sandbox, dead) -> set[str]:
    out = set()
    for cid, ip, _, _ in dead:
        out |= {l for l in sb.residue(NET, cid, [ip]) if "copy of" not in l and "-i eth9" not in l
                and not l.startswith("reservation")}
    return out


@pytest.mark.parametrize("seed", range(SEEDS))
def test_after_any_verb_exactly_the_dead_are_gone(tmp_path, flavour, package_exe, driver_bin, seed):
    rng = random.Random(seed)
    with Sandbox(tmp_path, flavour, package_exe, driver_bin) as sb:
        live, dead, orphans, live_ns = layout(sb, rng, seed)
        before = sb.tables().splitlines()
        native_before = sb.native_rules()
        native_doomed = {r for r in native_before if any(native_owned(r, cid, ip) for cid, ip, _, _ in dead)}
        doomed = dead_lines(sb, dead)
        assert doomed, "the layout planted nothing dead"
        expected = [l for l in before if l not in doomed]
        verb = rng.choice(["STATUS", "ADD", "CHECK", "GC"])
        conf = sb.status_conf(cniVersion="1.0.0" if verb in ("ADD", "CHECK") else "1.1.0")
        if verb in ("ADD", "CHECK"):
            conf["prevResult"] = {"cniVersion": "1.0.0", "ips": [{"address": "172.26.250.250/16"}]}
            rc, out, err = sb.plugin(verb, conf, cid=f"new-{seed}", netns=live_ns[0])
        elif verb == "GC":
            # the runtime lists the live ones and the orphans as valid: only the dead may go
            conf["cni.dev/valid-attachments"] = [{"containerID": c, "ifname": "eth0"} for c, *_ in live + orphans]
            rc, out, err = sb.plugin("GC", conf, cid="", netns="", ifname="")
        else:
            rc, out, err = sb.status()
        assert rc == 0, (verb, out, err)
        assert sb.tables().splitlines() == expected, f"seed {seed}, verb {verb}"
        assert len(native_doomed) == 5 * len(dead)
        assert sb.native_rules() == [r for r in native_before if r not in native_doomed], f"seed {seed}, verb {verb}"
        flows = sb.run(["conntrack", "-L"]).stdout
        assert not [ip for _, ip, _, _ in dead if f"src={ip} " in flows], flows
        assert all(f"src={ip} " in flows for _, ip, *_ in live + orphans) and "src=10.200.0.9 " in flows
        reserved = sb.reservations(NET)
        assert not {c for c, *_ in dead} & set(reserved.values())
        assert {c for c, *_ in live + orphans} <= set(reserved.values())
        records = {json.loads(p.read_text())["containerID"] for p in sb.state_dir().glob("r-*.json")}
        assert {c for c, *_ in live} <= records and not {c for c, *_ in dead} & records
        # and once more: nothing else changes
        assert sb.status()[0] == 0 and sb.tables().splitlines() == expected
        assert chain("", NET, live[0][0]) in "\n".join(expected)
