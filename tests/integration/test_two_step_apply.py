"""Red-team of the iptables-nft two-step apply (rules through iptables-nft-restore, then the dead chains in one
`nft -f` transaction): an nft that commits and then reports failure, a foreign jump to a dead chain made
between the two steps, IPv6 chains, and undo after each."""

from __future__ import annotations

import pytest

from testkit.sandbox import Stack, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
PORTS = ("8080:80/tcp",)
NOMAD = Stack("1.9", "go-cni-1.1.13")


@pytest.fixture
def sb(tmp_path, package_exe):
    with open_sandbox(tmp_path, "nft", package_exe, NOMAD) as s:
        yield s


def cli(sb, *args):
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(sb.root / "none")])


def stand_in_nft(sb, body: str):
    """An `nft` first on the plugin's PATH; the script sees its stdin in "$t" and its argv in "$@"."""
    fake = sb.bin_dir / "nft"
    fake.write_text(f'#!/bin/sh\nt=$(mktemp); cat > "$t"\n{body}\n')
    fake.chmod(0o755)
    return fake



def _del_without_its_netns(sb, fake, cid, netns, conflist):
    """The allocation's netns goes, then the runtime's DEL, with the stand-in nft in place (removed after)."""
    try:
        sb.remove_container(netns)
        proc = sb.driver("del", cid, netns, PORTS, conflist)
    finally:
        fake.unlink()
    assert proc.returncode == 0, proc.stderr

def test_nft_that_commits_then_fails_leaves_nothing_and_undo_puts_it_back(sb):
    """nft applies the chain transaction and then exits 1 (killed after the commit, say): restore's -F/-X
    then fails on chains already gone; the engine re-reads, finds nothing left, and the DEL succeeds. The
    journal's intent has no `done`: undo puts back what is gone."""
    conflist = sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    before = sb.normalized_tables()
    calls = sb.root / "nft-calls"
    fake = stand_in_nft(sb, f'echo "$@" >> "{calls}"; /usr/sbin/nft "$@" < "$t"; rc=$?\n'
                            f'if grep -q "delete chain" "$t"; then echo "Error: killed" >&2; exit 1; fi; exit $rc')
    _del_without_its_netns(sb, fake, cid, netns, conflist)
    assert "-f -" in calls.read_text()
    assert sb.residue(NET, cid, ips) == [] and sb.record(cid) is None
    out = cli(sb, "undo", cid)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sb.normalized_tables() == before, out.stdout


def _foreign_jump_between_the_two_transactions(sb):
    """Between the restore (the dead attachment's jumps gone) and the nft transaction, someone else jumps
    to the dead CNI- chain (once). Returns (cid, ips, chain)."""
    conflist = sb.conflist()
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    marker = sb.root / "jumped"
    ipt = sb.bin_dir / "iptables"
    fake = stand_in_nft(sb, (
        f'c=$(sed -n "s/^delete chain ip nat \\(CNI-[0-9a-f]*\\)$/\\1/p" "$t" | grep -v "^CNI-DN-" | head -1)\n'
        f'if [ -n "$c" ] && [ ! -e "{marker}" ]; then echo "$c" > "{marker}"; '
        f'"{ipt}" -t nat -A POSTROUTING -s 203.0.113.7/32 -j "$c" -m comment --comment foreign; fi\n'
        f'exec /usr/sbin/nft "$@" < "$t"'))
    _del_without_its_netns(sb, fake, cid, netns, conflist)
    assert marker.exists(), "the chain transaction never ran through nft"
    return cid, ips, marker.read_text().strip()


def test_foreign_jump_to_a_dead_chain_between_the_two_transactions_is_kept(sb):
    """HELD: the nft transaction and restore's -X fail, the engine re-reads, sees a rule it does not own
    jumping to the chain and leaves the chain; the DEL succeeds, the foreign rule is untouched, and every other
    part of the dead attachment is gone."""
    cid, ips, chain = _foreign_jump_between_the_two_transactions(sb)
    foreign = [l for l in sb.save(4, "nat").splitlines() if "foreign" in l]
    assert foreign == [f"-A POSTROUTING -s 203.0.113.7/32 -m comment --comment foreign -j {chain}"], foreign
    assert "still referenced by 1 rule(s) we do not own" in sb.log_file.read_text()
    left = sb.residue(NET, cid, ips)
    assert left and all(chain in l for l in left), left  # only the referenced chain and its own rules


@pytest.mark.xfail(strict=True, reason="pre-existing design: a chain left in place for a foreign reference "
                   "is forgotten with the record (dropped in the same sweep); no later sweep removes it")
def test_a_later_sweep_removes_the_chain_once_the_foreign_jump_is_gone(sb):
    cid, ips, chain = _foreign_jump_between_the_two_transactions(sb)
    sb.run([str(sb.bin_dir / "iptables"), "-t", "nat", "-D", "POSTROUTING", "-s", "203.0.113.7/32", "-m", "comment",
            "--comment", "foreign", "-j", chain], check=True)
    for _ in range(2):
        rc, _out, err = sb.status()
        assert rc == 0, err
    assert sb.residue(NET, cid, ips) == [], sb.residue(NET, cid, ips)


def test_dual_stack_chains_go_through_nft_as_ip6_and_undo_puts_them_back(sb):
    conflist = sb.conflist(sb.shipped("nomad-reaper-dualstack.conflist"))
    cid, netns = unique("alloc-"), sb.container()
    ips = ips_of(sb.driver("add", cid, netns, PORTS, conflist))
    assert any(":" in ip for ip in ips), ips
    other, other_ns = unique("alloc-"), sb.container()  # a live neighbour, left as it is
    other_ips = ips_of(sb.driver("add", other, other_ns, ("8081:80/tcp",), conflist))
    before = sb.normalized_tables()
    other_before = sorted(sb.residue(NET, other, other_ips))
    calls = sb.root / "nft-calls"
    fake = stand_in_nft(sb, f'cat "$t" >> "{calls}"; exec /usr/sbin/nft "$@" < "$t"')
    try:
        sb.remove_container(netns)
        rc, out, err = sb.status()
    finally:
        fake.unlink()
    assert rc == 0, err
    script = calls.read_text()
    assert "delete chain ip6 nat CNI-" in script and "delete chain ip nat CNI-" in script, script
    assert sb.residue(NET, cid, ips) == [], sb.residue(NET, cid, ips)
    assert sorted(sb.residue(NET, other, other_ips)) == other_before
    out = cli(sb, "undo", cid)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sb.normalized_tables() == before, out.stdout
