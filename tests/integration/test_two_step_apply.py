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
    fake.write_text(f'#!/bin/sh\nt=$(mktemp -p "{sb.root}"); cat > "$t"\n{body}\n')  # not in the host's /tmp
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


def _foreign_jump(sb, chain):
    return ["-t", "nat", "-D", "POSTROUTING", "-s", "203.0.113.7/32", "-m", "comment", "--comment", "foreign", "-j", chain]


def test_a_chain_held_by_a_foreign_jump_keeps_its_record_until_an_operators_sweep_removes_it(sb):
    """A dead attachment's chain that a rule not ours jumps to is left, and so is its record (marked held, with
    when a verb's sweep looks again): the verbs meanwhile sweep nothing (no `nft`, no restore per call);
    `list` and `doctor` say why; once the foreign jump is gone an operator's sweep removes the chain at once
    and drops the record. (It was forgotten with the record before: no later sweep removed it.)"""
    cid, ips, chain = _foreign_jump_between_the_two_transactions(sb)
    rc, _out, err = sb.status()  # the DEL's tombstone is looked at: the chain is held
    assert rc == 0, err
    rec = sb.record(cid)
    assert rec is not None and rec["left"]["tries"] == 1 and "still referenced by 1 rule" in rec["left"]["why"], rec
    log_size = sb.log_file.stat().st_size
    for _ in range(3):
        rc, _out, err = sb.status()
        assert rc == 0, err
    assert sb.record(cid) == rec  # not looked at again before its time: no sweep, no new mark
    assert "removed" not in sb.log_file.read_text()[log_size:]
    listed = cli(sb, "list")
    assert "held by something not ours" in listed.stdout and "still referenced" in listed.stderr, listed
    doctor = cli(sb, "doctor")
    assert "something not ours holds" in doctor.stdout, doctor.stdout
    out = cli(sb, "sweep", "--apply")  # still held: the record stays and the exit code says so
    assert out.returncode == 4 and "left in place" in out.stderr and sb.record(cid) is not None, out
    sb.run([str(sb.bin_dir / "iptables"), *_foreign_jump(sb, chain)], check=True)
    out = cli(sb, "sweep", "--apply")
    assert out.returncode == 0, out.stdout + out.stderr
    assert sb.residue(NET, cid, ips) == [], sb.residue(NET, cid, ips)
    assert sb.record(cid) is None


def test_a_held_chain_is_looked_at_again_by_the_verbs_after_its_retry_time(sb):
    """After its retry time a verb's sweep looks again: still held, the wait doubles; once the foreign jump is
    gone, the chain goes and the record is dropped."""
    cid, ips, chain = _foreign_jump_between_the_two_transactions(sb)
    assert sb.status()[0] == 0
    first = sb.record(cid)["left"]
    sb.edit_held(cid, retryAt="2020-01-01T00:00:00Z")
    assert sb.status()[0] == 0
    again = sb.record(cid)["left"]
    assert again["tries"] == 2 and again["retryAt"] > first["retryAt"], (first, again)
    sb.run([str(sb.bin_dir / "iptables"), *_foreign_jump(sb, chain)], check=True)
    assert sb.status()[0] == 0 and sb.record(cid) is not None  # its time has not come
    sb.edit_held(cid, retryAt="2020-01-01T00:00:00Z")
    rc, _out, err = sb.status()
    assert rc == 0, err
    assert sb.residue(NET, cid, ips) == [], sb.residue(NET, cid, ips)
    assert sb.record(cid) is None


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
