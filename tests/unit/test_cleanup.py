"""Every branch of the clean-up loop (cleanup.py), against the fake backend (testkit.fake_backend): one
transaction per family; a transaction that fails because the table changed is re-read, re-planned and
retried; a held xtables lock stops that family's clean-up at once; a transaction that keeps failing is
applied one operation at a time, so that a stubborn rule stays and the rest goes; a family whose tool is
missing is skipped unless a dead address of that family says rules exist there; a second run changes nothing;
a dry run changes nothing."""

from __future__ import annotations

import json

import pytest

from cni_reaper.cni.conf import parse
from cni_reaper.reap.cleanup import APPLY_ATTEMPTS, CleanupOptions, clean
from cni_reaper.reap.netfilter.interface import BackendError
from cni_reaper.reap.targets import Target
from testkit.artifacts import leak
from testkit.fake_backend import FakeBackend

pytestmark = pytest.mark.usefixtures("private_host")  # verbs in process: a throwaway netns and mount ns

NET = "nomad"
EMPTY = "*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n"


def text(*attachments: tuple[str, str, int]) -> str:
    nat = [":PREROUTING ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]", ":CNI-HOSTPORT-DNAT - [0:0]",
           ":CNI-HOSTPORT-SETMARK - [0:0]"]
    filt = [":FORWARD ACCEPT [0:0]", ":CNI-FORWARD - [0:0]"]
    for cid, ip, port in attachments:
        n, f, _ = leak(NET, cid, ip, port)
        nat += n
        filt += f
    return "*nat\n" + "\n".join(nat) + "\nCOMMIT\n*filter\n" + "\n".join(filt) + "\nCOMMIT\n"


@pytest.fixture
def conf(tmp_path):
    (tmp_path / "ipam" / NET).mkdir(parents=True)  # host-local keeps the network's addresses there
    return parse({"name": NET, "stateDir": str(tmp_path / "s"), "ipamDataDir": str(tmp_path / "ipam"), "logFile": ""})


def target(cid: str, ip: str) -> Target:
    return Target(NET, cid, "eth0", frozenset({ip}), whole=True)


DEAD = [("dead-a", "172.26.64.2", 8080), ("dead-b", "172.26.64.3", 8081)]
LIVE = ("live-c", "172.26.64.4", 8082)


def settings(conf, backend_for, dry_run: bool = False) -> CleanupOptions:
    return CleanupOptions([conf.ipamDataDir], conf.lockTimeout, backend_for, dry_run)


def run(conf, fake: FakeBackend, targets=None, dry_run: bool = False):
    targets = targets if targets is not None else [target(c, ip) for c, ip, _ in DEAD]
    return clean(targets, {}, settings(conf, lambda key: fake if key in (4, 6) else None, dry_run))


def test_without_host_local_nothing_tied_to_the_address_goes_but_for_the_runtimes_word(conf, tmp_path):
    """An IPAM that keeps no reservations (no network directory): nothing shows who else holds a dead address,
    or whether the container's next life is being made with it, so a sweep leaves its rules and its chains
    and says why (outcome.waiting); the runtime's own word (its DEL, GC) removes them."""
    (tmp_path / "ipam" / NET).rmdir()
    fake = FakeBackend(text(*DEAD, LIVE))
    before = dict(fake.text)
    outcome = run(conf, fake)
    assert fake.text == before and not outcome.removed
    assert set(outcome.waiting) == {(NET, c, "eth0") for c, _, _ in DEAD}
    assert all("reservation" in why for why in outcome.waiting.values())
    said = [Target(NET, c, "eth0", frozenset({ip}), whole=True, by_runtime=True) for c, ip, _ in DEAD]
    outcome = run(conf, fake, said)
    assert set(outcome.removed) == {(NET, c, "eth0") for c, _, _ in DEAD} and not outcome.waiting
    assert fake.text[4] == text(LIVE)


def test_one_transaction_removes_exactly_the_dead(conf):
    fake = FakeBackend(text(*DEAD, LIVE))
    outcome = run(conf, fake)
    assert fake.text[4] == text(LIVE)
    assert len(fake.transactions) == 1 and not outcome.errors and not outcome.failed
    assert sorted(k[1] for k in outcome.removed) == ["dead-a", "dead-b"]
    assert outcome.backend == "fake"


def test_a_table_changed_under_the_transaction_is_read_again_and_retried(conf):
    fake = FakeBackend(text(*DEAD, LIVE))
    fake.fail_next = APPLY_ATTEMPTS - 1
    outcome = run(conf, fake)
    assert len(fake.transactions) == APPLY_ATTEMPTS and fake.reads.count(4) == APPLY_ATTEMPTS
    assert fake.text[4] == text(LIVE) and not outcome.errors and not outcome.failed


def test_the_retry_plans_again_on_what_the_writer_left(conf):
    """A concurrent writer removes one dead rule between the read and the transaction: the retry's plan does
    not ask for it again (a stale plan would fail on it every time)."""
    fake = FakeBackend(text(*DEAD, LIVE))
    first_jump = next(l for l in fake.text[4].splitlines() if l.startswith("-A POSTROUTING") and "dead-a" in l)

    def writer(fb):
        fb.text[4] = fb.text[4].replace(first_jump + "\n", "")
        fb.fail_next = 1

    fake.between.append(writer)
    outcome = run(conf, fake)
    assert len(fake.transactions) == 2 and fake.text[4] == text(LIVE)
    assert not any(op.spec in first_jump for op in fake.applied[-1][1] if op.kind == "rule")
    assert not outcome.errors


def test_a_held_xtables_lock_stops_at_once_and_keeps_the_records(conf):
    fake = FakeBackend(text(*DEAD, LIVE))
    fake.lock_held = True
    outcome = run(conf, fake)
    assert len(fake.transactions) == 1, "no retries while the lock is held"
    assert fake.text[4] == text(*DEAD, LIVE)
    assert outcome.failed == {(NET, "dead-a", "eth0"), (NET, "dead-b", "eth0")}
    assert any("xtables lock" in e for e in outcome.errors)


def test_a_held_lock_on_one_family_does_not_stop_the_other(conf):
    v4, v6 = FakeBackend(text(*DEAD)), FakeBackend(EMPTY, text(("dead-a", "fd00::2", 8080)))
    v4.lock_held = True
    targets = [Target(NET, "dead-a", "eth0", frozenset({"172.26.64.2", "fd00::2"}), whole=True)]
    outcome = clean(targets, {}, settings(conf, {4: v4, 6: v6}.get))
    assert v6.text[6] == text() and v4.text[4] == text(*DEAD)
    assert outcome.failed == {(NET, "dead-a", "eth0")}
    assert any(item.startswith("ipv6 ") for item in outcome.removed[(NET, "dead-a", "eth0")])


def test_a_transaction_that_keeps_failing_is_applied_one_operation_at_a_time(conf):
    fake = FakeBackend(text(*DEAD, LIVE))
    fake.fail_batches = True
    outcome = run(conf, fake)
    singles = [ops for _, ops in fake.transactions if len(ops) == 1]
    assert len(fake.transactions) == APPLY_ATTEMPTS + len(singles) and singles
    assert fake.text[4] == text(LIVE) and not outcome.errors and not outcome.failed


def test_a_stubborn_rule_stays_and_the_rest_goes(conf):
    """The first operation of the plan (dead-a's masquerade jump) cannot be deleted: it stays, and so does the
    chain it jumps to; everything else of dead-a and all of dead-b goes."""
    fake = FakeBackend(text(*DEAD, LIVE))
    stubborn = next(l for l in fake.text[4].splitlines() if l.startswith("-A POSTROUTING -s 172.26.64.2/32"))
    fake.stubborn = {stubborn.split(" ", 2)[2]}
    outcome = run(conf, fake)
    chain = stubborn.split()[-1]
    left = [l for l in fake.text[4].splitlines() if l not in text(LIVE).splitlines()]
    assert left and all(l == stubborn or chain in l for l in left), left
    assert outcome.failed == {(NET, "dead-a", "eth0")}, "only the stubborn rule's owner is kept for a retry"
    assert any("cannot be deleted" in e and "172.26.64.2" in e for e in outcome.errors)
    assert len(outcome.removed[(NET, "dead-b", "eth0")]) == 7 and "dead-b" not in fake.text[4]
    assert not any("172.26.64.2" in l for l in left if l != stubborn)


def test_a_read_that_fails_in_the_one_at_a_time_pass_is_reported(conf):
    fake = FakeBackend(text(*DEAD))
    fake.fail_batches = True
    reads = []

    def read(family):
        reads.append(family)
        if len(reads) > APPLY_ATTEMPTS:
            raise BackendError("iptables-save failed")
        return FakeBackend.read(fake, family)

    fake.read = read
    outcome = run(conf, fake)
    assert any("iptables-save failed" in e for e in outcome.errors) and len(outcome.failed) == 2


def test_a_missing_tool_matters_only_for_a_family_with_dead_addresses(conf):
    fake = FakeBackend(text(*DEAD))

    def no_ip6tables(key):
        if key == 6:
            raise BackendError("no ip6tables on PATH")
        return fake if key == 4 else None

    orphan = Target(NET, "dead-a", "", frozenset(), whole=True, any_source=True)  # known by its tags only
    outcome = clean([orphan], {}, settings(conf, no_ip6tables))
    assert not outcome.errors and not outcome.failed and 6 not in outcome.backends
    dual = Target(NET, "dead-b", "eth0", frozenset({"172.26.64.3", "fd00::3"}), whole=True)
    outcome = clean([dual], {}, settings(conf, no_ip6tables))
    assert outcome.errors == ["ipv6: no ip6tables on PATH"] and outcome.failed == {dual.key}


def test_applying_twice_changes_nothing(conf):
    """Neutron's rule: after a clean-up, the same clean-up finds nothing and sends no transaction."""
    fake = FakeBackend(text(*DEAD, LIVE))
    run(conf, fake)
    after, sent = fake.text[4], len(fake.transactions)
    outcome = run(conf, fake)
    assert fake.text[4] == after and len(fake.transactions) == sent and not outcome.removed


def test_a_dry_run_plans_and_changes_nothing(conf):
    fake = FakeBackend(text(*DEAD, LIVE))
    outcome = run(conf, fake, dry_run=True)
    assert fake.transactions == [] and fake.text[4] == text(*DEAD, LIVE)
    assert sorted(k[1] for k in outcome.removed) == ["dead-a", "dead-b"]


def test_a_cached_result_that_cannot_be_rewritten_keeps_only_its_own_reservation(conf, tmp_path):
    """Many dead attachments' cached results are forgotten in one batch: one that cannot be rewritten (here a
    bind mount over it: rename onto a mount point fails, EBUSY) keeps its attachment's reservation and says
    so, and the others' cached results are rewritten and their reservations released all the same."""
    import json
    import os
    import subprocess

    from cni_reaper.reap.targets import Expect

    cache = tmp_path / "cache"
    (cache / "results").mkdir(parents=True)
    ipam = tmp_path / "ipam" / NET
    dead = [(f"dead-{i}", f"172.26.64.{i + 2}") for i in range(5)]
    for cid, ip in dead:
        (ipam / ip).write_text(f"{cid}\r\neth0")
        entry = {"kind": "cniCacheV1", "containerId": cid, "networkName": NET, "ifName": "eth0",
                 "result": {"cniVersion": "1.0.0", "ips": [{"address": f"{ip}/20"}]}}
        (cache / "results" / f"{NET}-{cid}-eth0").write_text(json.dumps(entry))
    stuck = cache / "results" / f"{NET}-dead-2-eth0"
    twin = tmp_path / "twin"
    twin.write_text(stuck.read_text())
    subprocess.run(["mount", "--bind", str(twin), str(stuck)], check=True)  # this test's private mount namespace
    try:
        targets = [Target(NET, cid, "eth0", frozenset({ip}), whole=True, parts=frozenset({"reservation"}),
                          expect={ip: Expect(conf.ipamDataDir, (cid, "eth0"))}, cache_dir=str(cache))
                   for cid, ip in dead]
        out = clean(targets, {}, settings(conf, lambda key: None))
    finally:
        subprocess.run(["umount", str(stuck)], check=True)
    assert sorted(p.name for p in ipam.iterdir() if p.name[0].isdigit()) == ["172.26.64.4"]  # dead-2's, kept
    assert (NET, "dead-2", "eth0") in out.failed and any("dead-2" in e for e in out.errors)
    for cid, _ in dead:
        doc = json.loads((cache / "results" / f"{NET}-{cid}-eth0").read_text())
        assert doc["result"]["ips"] == ([] if cid != "dead-2" else [{"address": "172.26.64.4/20"}])
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".cni-reaper.")]  # no temp file left beside it


def test_a_cached_result_that_cannot_be_read_keeps_its_reservation(conf, tmp_path):
    """An attachment's own libcni cache entry that cannot be read (not JSON here; or too large, or not a plain
    file) may still name the address: the address is not released (a red team's case)."""
    from cni_reaper.reap.targets import Expect

    cache = tmp_path / "cache"
    (cache / "results").mkdir(parents=True)
    ipam = tmp_path / "ipam" / NET
    (ipam / "172.26.64.9").write_text("dead-x\r\neth0")
    (cache / "results" / f"{NET}-dead-x-eth0").write_text('{"kind": "cniCacheV1", "result": {"ips": [')
    t = Target(NET, "dead-x", "eth0", frozenset({"172.26.64.9"}), whole=True, parts=frozenset({"reservation"}),
               expect={"172.26.64.9": Expect(conf.ipamDataDir, ("dead-x", "eth0"))}, cache_dir=str(cache))
    out = clean([t], {}, settings(conf, lambda key: None))
    assert (ipam / "172.26.64.9").exists() and t.key in out.failed and any("cannot be read" in e for e in out.errors)


def test_undo_adds_a_native_rule_back_without_the_handle_it_was_journaled_with(monkeypatch):
    """A sweep journals each native rule as nft printed it, its handle in it; in an add, nft's JSON schema
    reads a handle as the rule to add after (nft 1.0.6 here ignores it: a fake stands in for one that does
    not), so undo leaves it out."""
    from cni_reaper.reap import undo
    from cni_reaper.reap.holders import PortMap
    from cni_reaper.reap.netfilter.nftables import backend
    from cni_reaper.state.journal import Removed

    added: list = []

    class Nft:
        def read(self):
            return []

        def apply(self, ops):
            added.extend(json.loads(op.rule) for op in ops)

    class Nobody:
        def of(self, text):
            return None

    monkeypatch.setattr(backend, "NftBackend", Nft)
    rule = {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 41, "comment": "alloc-1",
            "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}},
                     {"dnat": {"addr": "10.0.0.2", "port": 80}}]}
    item = {"kind": "nft", "family": "ip", "table": "cni_hostport", "chain": "hostports", "rule": rule, "what": "x"}
    undo._native([Removed({"id": "e"}, 0, item)], Nobody(), PortMap(), undo.Report(), dry_run=False)
    assert added == [{k: v for k, v in rule.items() if k != "handle"}]


def test_a_cached_result_rewritten_by_libcni_since_it_was_read_is_not_written_over(tmp_path):
    """libcni rewrites an entry in place when the same attachment is added again: forgetting a dead life's
    addresses in what was read before must not put the old result back over the new one."""
    import json
    import os

    from cni_reaper.reap import cache

    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    entry = results / "nomad-abc-eth0"
    old = {"kind": "cniCacheV1", "containerId": "abc", "ifName": "eth0", "networkName": "nomad",
           "result": {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24"}]}}
    entry.write_text(json.dumps(old))
    os.utime(entry, ns=(1_000_000_000, 1_000_000_000))
    read = cache.Results(str(tmp_path / "cache")).of_network("nomad")
    assert [e.ips for e in read] == [["10.1.0.2"]]
    new = dict(old, result={"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24"}, {"address": "10.1.0.9/24"}]})
    entry.write_text(json.dumps(new))  # in place, as libcni writes it
    assert cache.forget(str(tmp_path / "cache"), [(read[0], {"10.1.0.2"})]) == [False]
    assert json.loads(entry.read_text()) == new
    read = cache.Results(str(tmp_path / "cache")).of_network("nomad")
    assert cache.forget(str(tmp_path / "cache"), [(read[0], {"10.1.0.2"})]) == [True]
    assert [e.ips for e in cache.Results(str(tmp_path / "cache")).of_network("nomad")] == [["10.1.0.9"]]


def test_two_dead_lives_of_one_cached_result_are_both_forgotten(tmp_path):
    """Two targets (say a sweep's and GC's) read one entry before either rewrote it: the second rewrite takes
    the first's output (this process's own change), so both addresses are forgotten."""
    import json

    from cni_reaper.reap import cache

    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True)
    entry = results / "nomad-abc-eth0"
    entry.write_text(json.dumps({"kind": "cniCacheV1", "containerId": "abc", "ifName": "eth0", "networkName": "nomad",
                                 "result": {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24"},
                                                                           {"address": "10.1.0.3/24"},
                                                                           {"address": "10.1.0.4/24"}]}}))
    first = cache.Results(str(tmp_path / "cache")).of_network("nomad")[0]
    second = cache.Results(str(tmp_path / "cache")).of_network("nomad")[0]
    assert cache.forget(str(tmp_path / "cache"), [(first, {"10.1.0.2"})]) == [True]
    assert cache.forget(str(tmp_path / "cache"), [(second, {"10.1.0.3"})]) == [True]
    assert [e.ips for e in cache.Results(str(tmp_path / "cache")).of_network("nomad")] == [["10.1.0.4"]]
