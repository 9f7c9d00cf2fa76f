"""The planner decides ownership from parsed rules only. These cases are built from the rule shapes the
reference plugins write (docs/how-it-works.md, "What a dead attachment leaves") plus look-alikes that must survive."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cni_reaper.reap.netfilter import chains
from cni_reaper.reap.netfilter.iptables.plan import parse_tag, plan, tagged_networks
from cni_reaper.reap.netfilter.iptables.restore import restore_text
from cni_reaper.reap.netfilter.iptables.rules import parse_rule, parse_save
from cni_reaper.reap.targets import Expect, Target
from testkit.fake_backend import apply_ops

N, X, Y = "nomad", "3e803d29-4f9d-ad8b-adb6-31456a39db69", "9b1c5a77-0d2e-4c1f-8a3b-6f2e1d0c9a88"


def test_chain_names_match_the_reference_formula():
    assert chains.masq_chain(N, X) == "CNI-6fcd2f53d5f720ec4eb5f04d"
    assert chains.dnat_chain(N, X) == "CNI-DN-6fcd2f53d5f720ec4eb5f"


def attachment(cid: str, ip: str, port: int) -> tuple[list[str], list[str]]:
    m, d = chains.masq_chain(N, cid), chains.dnat_chain(N, cid)
    tag = f'"name: \\"{N}\\" id: \\"{cid}\\""'
    dtag = f'"dnat name: \\"{N}\\" id: \\"{cid}\\""'
    nat = [
        f":{m} - [0:0]", f":{d} - [0:0]",
        f"-A POSTROUTING -s {ip}/32 -m comment --comment {tag} -j {m}",
        f"-A {m} -d 172.26.64.0/20 -m comment --comment {tag} -j ACCEPT",
        f"-A {m} ! -d 224.0.0.0/4 -m comment --comment {tag} -j MASQUERADE",
        f"-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment {dtag} -m multiport --dports {port} -j {d}",
        f"-A {d} -s 172.26.64.0/20 -p tcp -m tcp --dport {port} -j CNI-HOSTPORT-SETMARK",
        f"-A {d} -p tcp -m tcp --dport {port} -j DNAT --to-destination {ip}:80",
    ]
    filt = [
        f"-A CNI-FORWARD -d {ip}/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f"-A CNI-FORWARD -s {ip}/32 -j ACCEPT",
    ]
    return nat, filt


def tables_text(*extra_nat: str, attachments=((X, "172.26.64.2", 8080), (Y, "172.26.64.3", 8081))) -> str:
    nat = [":PREROUTING ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]", ":CNI-HOSTPORT-DNAT - [0:0]"]
    filt = [":FORWARD ACCEPT [0:0]", ":CNI-FORWARD - [0:0]"]
    for cid, ip, port in attachments:
        n, f = attachment(cid, ip, port)
        nat += n
        filt += f
    nat += list(extra_nat)
    return "*nat\n" + "\n".join(nat) + "\nCOMMIT\n*filter\n" + "\n".join(filt) + "\nCOMMIT\n"


def tables(*extra_nat: str, **kw):
    return parse_save(tables_text(*extra_nat, **kw))


def dead(cid=X, ips=("172.26.64.2",), **kw) -> Target:
    return Target(N, cid, "eth0", frozenset(ips), whole=kw.pop("whole", True), **kw)


def summary(p):
    return sorted((op.kind, op.table, op.chain, op.spec if op.kind == "rule" else "") for op in p.ops)


def test_comment_with_escaped_quotes_is_parsed():
    r = parse_rule("POSTROUTING", f'-s 10.0.0.2/32 -m comment --comment "name: \\"{N}\\" id: \\"{X}\\"" -j CNI-x')
    assert r.comment == f'name: "{N}" id: "{X}"' and r.source_ip == "10.0.0.2" and r.target == "CNI-x"


def test_a_wholly_dead_attachment_loses_exactly_its_artifacts():
    p = plan(tables(), [dead()], 4)
    m, d = chains.masq_chain(N, X), chains.dnat_chain(N, X)
    got = summary(p)
    assert ("chain", "nat", m, "") in got and ("chain", "nat", d, "") in got
    assert sum(1 for k, t, c, s in got if k == "rule" and c == "POSTROUTING") == 1
    assert sum(1 for k, t, c, s in got if k == "rule" and c == "CNI-HOSTPORT-DNAT") == 1
    assert sum(1 for k, t, c, s in got if k == "rule" and c == "CNI-FORWARD") == 2
    assert len(got) == 6
    assert not [o for o in p.ops if Y in o.spec or "172.26.64.3" in o.spec]


def test_restore_text_is_one_transaction_per_table_rules_before_chains_in_chain_order():
    """What iptables-{nft,legacy}-restore is fed: the text the nft backend applies (restore.restore_text)."""
    p = plan(tables(), [dead(), dead(Y, ips=("172.26.64.3",))], 4)
    text = restore_text(list(reversed(p.ops)))
    blocks = [b.strip().splitlines() for b in text.split("COMMIT") if b.strip()]
    assert [b[0] for b in blocks] == ["*filter", "*nat"] or [b[0] for b in blocks] == ["*nat", "*filter"]
    for block in blocks:
        lines = block[1:]
        kinds = [l.split()[0] for l in lines]
        first_flush = kinds.index("-F") if "-F" in kinds else len(kinds)
        assert set(kinds[:first_flush]) <= {"-D"} and set(kinds[first_flush:]) <= {"-F", "-X"}
        deletes = [l.split()[1] for l in lines[:first_flush]]
        assert deletes == sorted(deletes)  # chain order: iptables-nft finds each rule at the head
    # every planned op is in it, written from the saved rule text
    for op in p.ops:
        expected = [f"-D {op.chain} {op.spec}"] if op.kind == "rule" else [f"-F {op.chain}", f"-X {op.chain}"]
        assert all(line in text.splitlines() for line in expected)
    assert text.endswith("COMMIT\n")


def test_planning_again_after_the_plan_is_applied_gives_nothing():
    """Neutron's apply-twice rule, on the planner: apply the ops to the tables, plan again: nothing."""
    text = tables_text()
    targets = [dead(), dead(Y, ips=("172.26.64.3",))]
    p = plan(parse_save(text), targets, 4)
    assert p.ops
    after = apply_ops(text, p.ops)
    assert plan(parse_save(after), targets, 4).ops == []
    assert apply_ops(after, []) == after


def test_protected_ip_keeps_its_untagged_firewall_rules():
    p = plan(tables(), [dead()], 4, protected={(N, X, "eth0"): {"172.26.64.2"}})
    assert not [o for o in p.ops if o.chain == "CNI-FORWARD"]
    assert any("in use" in s for s in p.skipped)


def test_earlier_incarnation_of_a_live_attachment_keeps_the_shared_chains():
    # X is live again with 172.26.64.9; its old life had .2: the old jump and the old DNAT go, chains stay
    attachment(X, "172.26.64.9", 8080)
    t = tables(f'-A POSTROUTING -s 172.26.64.9/32 -m comment --comment "name: \\"{N}\\" id: \\"{X}\\"" '
               f"-j {chains.masq_chain(N, X)}",
               f"-A {chains.dnat_chain(N, X)} -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.26.64.9:80")
    p = plan(t, [dead(whole=False)], 4)
    got = summary(p)
    assert not [g for g in got if g[0] == "chain"]
    assert [g[2] for g in got if g[0] == "rule"].count("POSTROUTING") == 1
    assert any("172.26.64.2/32" in g[3] for g in got if g[2] == "POSTROUTING")
    assert any("--to-destination 172.26.64.2:80" in g[3] for g in got)
    assert not any("172.26.64.9" in g[3] for g in got)


def test_dnat_chain_forwarding_to_a_newer_life_is_kept():
    t = tables(f"-A {chains.dnat_chain(N, X)} -p udp -m udp --dport 8080 -j DNAT --to-destination 172.26.64.9:80")
    p = plan(t, [dead()], 4)
    assert ("chain", "nat", chains.dnat_chain(N, X), "") not in summary(p)
    assert not [o for o in p.ops if o.chain == "CNI-HOSTPORT-DNAT"]


def test_a_dead_dnat_chain_that_forwards_elsewhere_is_held_unless_a_newer_life_holds_it():
    """No other life of X (whole): what else its chain DNATs to is not ours, the chain and its jump stay and X's
    record is held (looked at again later). A newer life of X (not whole): it is that life's, nothing held."""
    d = chains.dnat_chain(N, X)
    t = tables(f"-A {d} -p udp -m udp --dport 8080 -j DNAT --to-destination 198.51.100.9:80")
    for whole in (True, False):
        p = plan(t, [dead(whole=whole)], 4)
        assert ("chain", "nat", d, "") not in summary(p) and not [o for o in p.ops if o.chain == "CNI-HOSTPORT-DNAT"]
        assert [o.spec for o in p.ops if o.chain == d] == ["-p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.26.64.2:80"]
        assert p.held == ({(N, X): f"nat {d}: DNATs to 1 address(es) of no dead life of it"} if whole else {})


def test_two_dead_ifnames_of_one_container_take_the_dnat_chain_they_share():
    """portmap's chain is named by network and container ID, not ifname: X's eth0 and eth1 both dead in one
    sweep take the chain and its jump (each alone would see the other's DNAT in it)."""
    d = chains.dnat_chain(N, X)
    t = tables(f"-A {d} -p tcp -m tcp --dport 8080 -j DNAT --to-destination 172.26.64.7:80")
    eth1 = Target(N, X, "eth1", frozenset({"172.26.64.7"}), whole=True)
    p = plan(t, [dead(), eth1], 4)
    assert ("chain", "nat", d, "") in summary(p) and [o for o in p.ops if o.chain == "CNI-HOSTPORT-DNAT"]
    assert not p.held
    p = plan(t, [dead()], 4)  # eth1 alone is not dead: the chain stays for it
    assert ("chain", "nat", d, "") not in summary(p)


def test_lookalikes_survive():
    m = chains.masq_chain(N, X)
    t = tables(
        # a comment quoting the tag inside another string
        f'-A POSTROUTING -s 172.26.64.2/32 -m comment --comment "copy of name: \\"{N}\\" id: \\"{X}\\"" -j {m}',
        # the right tag, but not jumping to the chain the plugin would make for it
        f'-A POSTROUTING -s 172.26.64.2/32 -m comment --comment "name: \\"{N}\\" id: \\"{X}\\"" -j MASQUERADE',
        # a chain named CNI- plus other hex
        ":CNI-0123456789abcdef01234567 - [0:0]",
        "-A CNI-0123456789abcdef01234567 -j MASQUERADE",
    )
    p = plan(t, [dead()], 4)
    specs = [o.spec for o in p.ops]
    assert not any("copy of" in s for s in specs)
    assert not any(s.endswith("-j MASQUERADE") and o.chain == "POSTROUTING" for s, o in zip(specs, p.ops))
    # the look-alike jump into X's chain keeps the chain
    assert ("chain", "nat", m, "") not in summary(p)
    assert "CNI-0123456789abcdef01234567" not in {o.chain for o in p.ops}


def test_a_rule_without_the_owner_tag_inside_the_chain_keeps_the_chain():
    m = chains.masq_chain(N, X)
    p = plan(tables(f"-A {m} -d 10.0.0.0/8 -j ACCEPT"), [dead()], 4)
    assert ("chain", "nat", m, "") not in summary(p)


def test_keep_masq_chain_during_a_del_with_live_netns():
    p = plan(tables(), [dead(keep_masq_chain=True)], 4)
    assert ("chain", "nat", chains.masq_chain(N, X), "") not in summary(p)
    assert ("chain", "nat", chains.dnat_chain(N, X), "") in summary(p)


def test_ipv6_firewall_rules_use_128():
    v6 = parse_save("*filter\n:CNI-FORWARD - [0:0]\n"
                    "-A CNI-FORWARD -d fd00::2/128 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
                    "-A CNI-FORWARD -s fd00::2/128 -j ACCEPT\n-A CNI-FORWARD -s fd00::3/128 -j ACCEPT\nCOMMIT\n")
    p = plan(v6, [dead(ips=("172.26.64.2", "fd00::2"), parts=frozenset({"forward"}))], 6)
    assert len(p.ops) == 2 and all("fd00::2/128" in o.spec for o in p.ops)


def test_tagged_networks_finds_unrecorded_attachments_and_ignores_lookalikes():
    t = tables(f'-A POSTROUTING -s 172.26.64.7/32 -m comment --comment "name: \\"{N}\\" id: \\"fake\\"" -j MASQUERADE')
    found = tagged_networks(t)
    assert found == {(N, X): {"172.26.64.2"}, (N, Y): {"172.26.64.3"}}


def test_the_rule_tokenizer_agrees_with_shlex_on_saved_rules():
    import shlex

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cni_reaper.reap.netfilter.iptables.rules import split

    # outside quotes iptables-save writes no whitespace but single spaces and no single quotes (shlex reads those as quotes)
    words = st.text(st.characters(blacklist_characters='\' "\\\n\t\r\x0b\x0c', blacklist_categories=("Cs", "Zs", "Cc")),
                    min_size=1, max_size=8)
    comments = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=20)

    def quote(c: str) -> str:  # how iptables-save writes a comment
        return '"' + c.replace("\\", "\\\\").replace('"', '\\"') + '"'

    @settings(max_examples=500, deadline=None)
    @given(st.lists(st.one_of(words, comments.map(quote)), min_size=1, max_size=8))
    def check(parts):
        spec = " ".join(parts)
        assert split(spec) == shlex.split(spec)

    check()


def test_a_held_xtables_lock_is_reported_as_such_by_the_restore_backend():
    """iptables-legacy-restore -w exits 4 when the lock stays held: the sweep then stops retrying for now."""
    import pytest

    from cni_reaper.reap.netfilter.interface import BackendError, LockHeld
    from cni_reaper.reap.netfilter.iptables.restore import SaveRestoreBackend

    backend = SaveRestoreBackend("legacy")
    held = ["/bin/sh", "-c", "echo 'Another app is currently holding the xtables lock.' >&2; exit 4"]
    with pytest.raises(LockHeld):
        backend._run(held)
    with pytest.raises(BackendError) as failed:
        backend._run(["/bin/sh", "-c", "echo 'line 2 failed' >&2; exit 1"])
    assert not isinstance(failed.value, LockHeld) and "line 2 failed" in str(failed.value)


@given(st.text(st.sampled_from(['a', 'b', ' ', '"', '\\', '-', '\0', 'é']), max_size=40))
@settings(max_examples=3000, deadline=None)
@example('-m comment --comment "name: \\"nomad\\" id: \\"x\\"" -j CNI-1')
@example('a"b c"d "" \\"e\\\\" f')
def test_the_fast_split_of_a_saved_rule_reads_as_the_reference_reader(spec):
    """split() cuts the plugins' quoted comments in C; character by character (_split_slow) is the reference."""
    from cni_reaper.reap.netfilter.iptables.rules import _split_slow, split

    assert split(spec) == _split_slow(spec)


def _nft_stand_in(tmp_path, script: str):
    """An `nft` program (sh) for the branches the real one cannot be made to take; it logs its arguments."""
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend

    exe = tmp_path / "nft"
    exe.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls"\n{script}\n')
    exe.chmod(0o755)
    return NftBackend(str(exe)), tmp_path / "calls"


def test_native_tables_are_listed_at_once_and_a_missing_one_is_absent_not_a_failure(tmp_path):
    """`nft list tables` fetches every rule of the host: it is asked only when a listing failed otherwise
    than as a missing table does; a table that is there and cannot be listed fails the read (nothing of the
    native tables is removed then)."""
    import pytest

    from cni_reaper.reap.netfilter.interface import BackendError

    missing = "echo 'Error: No such file or directory' >&2; exit 1"
    backend, calls = _nft_stand_in(tmp_path, missing)
    assert backend.read() == []
    assert "list tables" not in calls.read_text() and calls.read_text().count("list table ") == 3

    refused = ('case "$*" in *"list tables"*) echo \'{"nftables": [{"table": {"family": "ip", "name": "cni_hostport"}}]}\'; '
               "exit 0;; esac\necho 'Error: Operation not permitted' >&2; exit 1")
    (tmp_path / "refused").mkdir()
    backend, calls = _nft_stand_in(tmp_path / "refused", refused)
    with pytest.raises(BackendError, match="not permitted"):
        backend.read()
    assert "list tables" in calls.read_text()

    elsewhere = ('case "$*" in *"list tables"*) echo \'{"nftables": []}\'; exit 0;; esac\n'
                 "echo 'Error: Operation not permitted' >&2; exit 1")
    (tmp_path / "elsewhere").mkdir()
    backend, calls = _nft_stand_in(tmp_path / "elsewhere", elsewhere)
    assert backend.read() == []  # not there: nothing to read, whatever the listing said


def test_iptables_nft_chains_are_removed_in_one_nft_script_when_their_names_are_plain():
    from cni_reaper.reap.netfilter.iptables.restore import _nft_name, chain_script
    from cni_reaper.reap.netfilter.iptables.rules import Op

    ops = [Op(kind="chain", table="nat", chain="CNI-DN-0123abcd", spec="", owner=("n", "c"), what="dnat chain", index=0,
              part="dnat")]
    assert chain_script(6, ops) == "flush chain ip6 nat CNI-DN-0123abcd\ndelete chain ip6 nat CNI-DN-0123abcd\n"
    assert _nft_name("CNI-0123456789abcdef01234567") and _nft_name("nat")
    for odd in ("", "x" * 29, "1CNI", "CNI;flush", "CNI x", 'CNI"', "CNI-é", "-CNI"):
        assert not _nft_name(odd), odd


def test_native_tables_are_listed_side_by_side(tmp_path):
    """The three listings run at once (the host-port table's takes the longest): each stand-in waits until
    all three have started, which only listings run side by side can do."""
    script = (f'touch "{tmp_path}/started.$$"\nn=0\nwhile [ "$(ls "{tmp_path}" | grep -c started)" -lt 3 ]; do\n'
              '  n=$((n+1)); [ $n -gt 200 ] && { echo "Error: alone" >&2; exit 1; }; sleep 0.05\ndone\n'
              "echo 'Error: No such file or directory' >&2; exit 1")
    backend, calls = _nft_stand_in(tmp_path, script)
    assert backend.read() == [] and "list tables" not in calls.read_text()


# -- the plugins' tag, cut by hand (no `re` on a clean-up's path) ------------------------------------------
_TAG_PIECES = st.sampled_from(['name: "', '" id: "', '"', "dnat ", "snat ", "x", " ", "nomad", "\\", "a1"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(_TAG_PIECES, max_size=8).map("".join) | st.text(max_size=30))
@example('name: "nomad" id: "a1"')
@example('dnat name: "n" id: ""')
@example('snat name: "" id: "x" id: "y"')
@example('name: "')
def test_the_tag_is_read_as_the_plugins_pattern_reads_it(comment):
    import re

    m = re.fullmatch(r'(?:(dnat|snat) )?name: "([^"]*)" id: "([^"]*)"', comment)
    assert parse_tag(comment) == (m.groups() if m else None)


def test_value_classes_compare_and_copy_as_dataclasses_did():
    a = Target("n", "c", "eth0", frozenset({"10.0.0.2"}), True, expect={"10.0.0.2": Expect("/d", ("c", "eth0"))})
    b = Target("n", "c", "eth0", frozenset({"10.0.0.2"}), True)
    assert a == b and hash(a) == hash(b) and a != b.replace(whole=False)  # `expect` is not compared
    assert a.narrowed(frozenset(), False).whole is False and a.whole is True
    with pytest.raises(TypeError):
        a.replace(nothing=1)


def _loop_reference(chain, spec, index=0):
    """parse_rule as it was: every token looked at in turn (the reference the faster one is held to)."""
    from cni_reaper.reap.netfilter.iptables.rules import Rule, split

    tokens = tuple(split(spec))
    fields = {"source": None, "comment": None, "target": None, "to_destination": None}
    negate, i = False, 0
    while i < len(tokens):
        tok, nxt = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else None
        if tok == "!":
            negate, i = True, i + 1
            continue
        if tok in ("-s", "--source") and nxt is not None:
            fields["source"] = None if negate else nxt
        elif tok == "--comment" and nxt is not None:
            fields["comment"] = nxt
        elif tok in ("-j", "-g", "--jump", "--goto") and nxt is not None:
            fields["target"] = nxt
        elif tok == "--to-destination" and nxt is not None:
            fields["to_destination"] = nxt
        negate, i = False, i + 1
    return Rule(chain, spec, tokens, fields["source"], fields["comment"], fields["target"], fields["to_destination"],
                index)


_RULE_TOKENS = st.sampled_from(["-s", "--source", "!", "--comment", "-j", "-g", "--jump", "--goto", "--to-destination",
                                "-d", "10.0.0.2/32", "CNI-x", "DNAT", "10.0.0.2:80", '"name: \\"n\\" id: \\"x\\""',
                                "-m", "comment", "-p", "tcp", '"-j"', '"!"'])


@settings(max_examples=4000, deadline=None)
@given(st.lists(_RULE_TOKENS, max_size=12))
def test_the_rule_fields_are_what_reading_every_token_in_turn_gives(tokens):
    """HELD: the fields found in C (the last option with a value after it, a "!" right before -s) are the
    fields the token-by-token reading gave, for any order of options, values and negations."""
    spec = " ".join(tokens)
    assert parse_rule("C", spec, 3) == _loop_reference("C", spec, 3)
