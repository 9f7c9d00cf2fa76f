"""A dead attachment's leftover that something not ours holds keeps its record, held, looked at again later
(docs/how-it-works.md, "Evidence"): from a red team of the held records (their marks at the edges, a DEL meanwhile, a
foreign rule inside portmap's chain, damaged index journals, the address handed on, sweeps side by side).
Also the DEL that keeps the masquerade chain for bridge while another namespace is at the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cni_reaper import jsonio
from cni_reaper.reap.netfilter import chains
from cni_reaper.state.index import Entry
from cni_reaper.state.record import of_document
from testkit.sandbox import REPO, Stack, ips_of, open_sandbox, sh, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
PORTS = ("8080:80/tcp",)
STACK = Stack("1.1.1", "go-cni-1.1.7")


@pytest.fixture(params=["nft", "legacy"])
def sb(request, tmp_path, package_exe):
    with open_sandbox(tmp_path, request.param, package_exe, STACK) as s:
        yield s


@pytest.fixture
def nft_sb(tmp_path, package_exe):
    with open_sandbox(tmp_path, "nft", package_exe, STACK) as s:
        yield s


def _record_path(sb, cid):
    return next(p for p in sb.state_dir().glob("r-*.json") if json.loads(p.read_text())["containerID"] == cid)


def _remake_same_path(sb, netns):
    """The namespace gone and another one made at the same path (Nomad's /var/run/netns/<alloc ID>)."""
    sb.remove_container(netns)
    name = os.path.basename(netns)
    sh("ip", "netns", "add", name)
    sb.containers.append(name)


def _held(sb, subnet=None):
    """A dead attachment whose masquerade chain a foreign rule jumps to: held after a sweep."""
    conflist = sb.conflist(subnet=subnet) if subnet else sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    rule = ["POSTROUTING", "-s", "203.0.113.7/32", "-m", "comment", "--comment", "foreign", "-j",
            chains.masq_chain(NET, cid)]
    sb.run([str(sb.bin_dir / "iptables"), "-t", "nat", "-A", *rule], check=True)
    sb.remove_container(netns)
    assert sb.status()[0] == 0
    assert sb.record(cid)["left"]["tries"] == 1
    return conflist, cid, ips, rule


def _unjump(sb, rule):
    sb.run([str(sb.bin_dir / "iptables"), "-t", "nat", "-D", *rule], check=True)


def test_a_del_that_keeps_the_chain_for_bridge_leaves_the_record_for_a_look(sb):
    """DEL while the netns path holds another live namespace: the masquerade chain stays for bridge's DEL (it
    fails on a missing chain), bridge finds none of the addresses there and leaves it: the tombstone keeps
    asking for a look, and the sweep after the DEL takes the chain (it was forgotten before)."""
    conflist = sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    _remake_same_path(sb, netns)
    proc = sb.driver("del", cid, netns, PORTS, conflist)
    assert proc.returncode == 0, proc.stderr
    assert sb.record(cid)["deleted"]["verify"] is True
    for _ in range(2):
        assert sb.status()[0] == 0
    assert sb.residue(NET, cid, ips) == [], sb.residue(NET, cid, ips)
    assert sb.record(cid) is None


def test_a_del_of_a_held_attachment_keeps_it_held(sb):
    conflist, cid, ips, rule = _held(sb)
    before = sb.record(cid)["left"]
    sh("ip", "netns", "add", os.path.basename(sb.record(cid)["current"]["netns"]))  # another namespace there
    sb.containers.append(os.path.basename(sb.record(cid)["current"]["netns"]))
    assert sb.driver("del", cid, sb.record(cid)["current"]["netns"], PORTS, conflist).returncode == 0
    rec = sb.record(cid)
    assert rec["deleted"]["verify"] is True and rec["left"] == before, rec
    sb.edit_held(cid, retryAt="2020-01-01T00:00:00Z")
    assert sb.status()[0] == 0 and sb.record(cid)["left"]["tries"] == 2  # looked at again: still held
    _unjump(sb, rule)
    out = sb.cli("sweep", "--apply")
    assert out.returncode == 0, out.stdout + out.stderr
    assert sb.residue(NET, cid, ips) == [] and sb.record(cid) is None


def test_a_mark_at_the_limit_of_tries_is_still_a_record(nft_sb):
    sb = nft_sb
    _, cid, ips, rule = _held(sb)
    sb.edit_held(cid, tries=1 << 30, retryAt="2020-01-01T00:00:00Z")
    assert sb.status()[0] == 0  # looked at again, still held: the count stays at its limit
    assert sb.record(cid)["left"]["tries"] == 1 << 30
    assert not list(sb.state_dir().glob("*.corrupt"))
    _unjump(sb, rule)
    assert sb.cli("sweep", "--apply").returncode == 0
    assert sb.residue(NET, cid, ips) == [] and sb.record(cid) is None


def test_a_retry_time_further_off_than_an_hour_is_due(nft_sb):
    """Written while the clock ran ahead (or damaged): the verbs do not wait for it."""
    sb = nft_sb
    _, cid, ips, rule = _held(sb)
    sb.edit_held(cid, retryAt="2999-01-01T00:00:00Z")
    _unjump(sb, rule)
    for _ in range(2):
        assert sb.status()[0] == 0
    assert sb.residue(NET, cid, ips) == [] and sb.record(cid) is None


def test_a_foreign_rule_in_a_dead_dnat_chain_keeps_the_record_held(sb):
    """A rule not ours inside portmap's chain of a wholly dead attachment: the chain and its host-port jump
    stay (what the chain forwards to is someone else's) and so does the record, held; once the rule is gone
    an operator's sweep takes them."""
    conflist = sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    dn = chains.dnat_chain(NET, cid)
    foreign = [dn, "-p", "tcp", "--dport", "9999", "-j", "DNAT", "--to-destination", "198.51.100.9:80"]
    ipt = str(sb.bin_dir / "iptables")
    sb.run([ipt, "-t", "nat", "-A", *foreign], check=True)
    sb.remove_container(netns)
    assert sb.status()[0] == 0
    rec = sb.record(cid)
    assert rec is not None and "DNATs to 1 address" in rec["left"]["why"], rec
    assert any(l.startswith("-A CNI-HOSTPORT-DNAT") for l in sb.residue(NET, cid, ips))
    sb.run([ipt, "-t", "nat", "-D", *foreign], check=True)
    assert sb.cli("sweep", "--apply").returncode == 0
    assert sb.residue(NET, cid, ips) == [] and sb.record(cid) is None


@pytest.mark.parametrize("left", [float("nan"), float("inf"), 1e300, -5.0])
def test_an_index_journal_line_whose_mark_is_no_time_is_not_taken(nft_sb, left):
    """The index's journal says held for a record that has no mark: the line is refused, the index made anew
    from the records, and the dead attachment is cleaned."""
    sb = nft_sb
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, sb.conflist()))
    path = _record_path(sb, cid)
    v = Entry.of_record(of_document(json.loads(path.read_text())), os.stat(path).st_ino).to_list()
    v[-1] = left
    with open(sb.state_dir() / ".index-journal", "a") as f:
        f.write(jsonio.dumps([path.name, v]) + "\n")
    sb.remove_container(netns)
    for _ in range(2):
        assert sb.status()[0] == 0
    assert sb.residue(NET, cid, ips) == [] and sb.record(cid) is None


@pytest.mark.parametrize("reboot", [False, True])
def test_a_held_attachment_looked_at_again_spares_the_new_holder_of_its_address(sb, reboot):
    """Its address went to a new allocation meanwhile (after a reboot too): the retries, the verbs' and an
    operator's, leave every rule and the reservation of the new one as they are."""
    conflist, x, xips, rule = _held(sb, subnet="10.99.0.0/30")
    assert x not in sb.reservations(NET).values()
    if reboot:
        sb.reboot()
    y, yns = unique("alloc-"), sb.container()
    yips = ips_of(sb.driver("add", y, yns, ("8081:80/tcp",), conflist))
    assert yips == xips, (xips, yips)
    before = sorted(sb.residue(NET, y, yips))
    assert any("CNI-FORWARD" in l for l in before) and f"reservation {yips[0]}" in before, before
    sb.edit_held(x, retryAt="2020-01-01T00:00:00Z")
    assert sb.status()[0] == 0
    assert sorted(sb.residue(NET, y, yips)) == before
    _unjump(sb, rule)
    assert sb.cli("sweep", "--apply").returncode == 0
    assert sorted(sb.residue(NET, y, yips)) == before
    assert sb.record(x) is None and sb.record(y) is not None
    assert not [l for l in sb.residue(NET, x, []) if chains.masq_chain(NET, x) in l]


INDEX_AGREES = """
import sys
from cni_reaper.state.index import Entry
from cni_reaper.state.store import Store
s = Store(sys.argv[1]).open(create=False)
with s.locked():
    es = s.entries()
    recs = {n: s.load_named(n) for n in s.names()}
    bad = [n for n, r in recs.items() if Entry.of_record(r, es[n].ino).to_list() != es[n].to_list()]
print("OK" if not bad and set(es) == set(recs) else f"BAD {bad} {sorted(set(es) ^ set(recs))}")
"""


def test_a_held_retry_while_adds_and_sweeps_run_side_by_side(sb):
    """Its retry time has come while four ADDs and four STATUS sweeps run at once: one sweep looks again
    (tries 1 -> 2), every call succeeds, every new attachment keeps what it has, and the index as the next
    call reads it agrees with the records."""
    conflist, x, _, _ = _held(sb)
    sb.edit_held(x, retryAt="2020-01-01T00:00:00Z")
    procs, adds = [], []
    status = {"CNI_COMMAND": "STATUS", "CNI_CONTAINERID": "", "CNI_NETNS": "", "CNI_IFNAME": "",
              "CNI_PATH": f"{sb.plugin_dir}:{sb.plugins}"}
    for i in range(4):
        cid, ns = unique("alloc-"), sb.container()
        adds.append(cid)
        argv = [sb.driver_bin, "-conflist", str(conflist), "-plugindir", f"{sb.plugin_dir}:{sb.plugins}", "-op", "add",
                "-id", cid, "-netns", ns, "-ports", "omit", "-port", f"{9000 + i}:80/tcp"]
        procs.append((subprocess.Popen(sb.wrap(argv), env=sb.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True), None))
        procs.append((subprocess.Popen(sb.wrap([str(sb.plugin_dir / "cni-reaper")]), env=sb.env(status),
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True), json.dumps(sb.status_conf())))
    for p, stdin in procs:
        out, err = p.communicate(stdin, timeout=120)
        assert p.returncode == 0, (out, err)
    assert sb.record(x)["left"]["tries"] == 2
    for cid in adds:
        assert sb.record(cid).get("left") is None
        assert any("CNI-HOSTPORT-DNAT" in l for l in sb.residue(NET, cid, []))
    out = sb.run([sys.executable, "-c", INDEX_AGREES, "/var/lib/cni/reaper"],
                 env={"PYTHONPATH": str(REPO / "plugin")})
    assert out.stdout.strip() == "OK", out.stdout + out.stderr
