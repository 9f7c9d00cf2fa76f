"""A put-back is a plan applied through the backend a clean-up removes through (issue 32, item 2): undo makes
iptables and native operations (iptables.rules PUT_BACKS, nftables.rules `adding`) and hands them to the
backend's `apply`; no backend offers another way to write."""

from __future__ import annotations

import json

import pytest

from cni_reaper.reap.netfilter.iptables.restore import SaveRestoreBackend, put_back_text, restore_text
from cni_reaper.reap.netfilter.iptables.rules import chain_op, insert_op, new_chain_op, puts_back
from cni_reaper.reap.netfilter.nftables.backend import NftBackend
from cni_reaper.reap.netfilter.nftables.rules import NativeOp, adding, json_script

OWNER = ("nomad", "alloc-1")


def test_a_put_back_makes_its_chains_first_and_puts_each_rule_at_its_position():
    ops = [insert_op("nat", "POSTROUTING", "-s 10.0.0.2/32 -j CNI-abc", 2, OWNER, "jump"),
           new_chain_op("nat", "CNI-abc", OWNER, "chain"),
           insert_op("nat", "CNI-abc", "-d 10.0.0.0/24 -j ACCEPT", -1, OWNER, "chain"),
           insert_op("filter", "CNI-FORWARD", "-d 10.0.0.2/32 -j ACCEPT", 0, OWNER, "forward")]
    assert puts_back(ops)
    assert put_back_text(ops) == (
        "*nat\n-N CNI-abc\n-I POSTROUTING 3 -s 10.0.0.2/32 -j CNI-abc\n-A CNI-abc -d 10.0.0.0/24 -j ACCEPT\nCOMMIT\n"
        "*filter\n-I CNI-FORWARD 1 -d 10.0.0.2/32 -j ACCEPT\nCOMMIT\n")


def test_one_transaction_either_removes_or_puts_back():
    assert not puts_back([chain_op("nat", "CNI-abc", OWNER, "chain", "masq")])
    with pytest.raises(ValueError):
        puts_back([chain_op("nat", "CNI-abc", OWNER, "chain", "masq"), new_chain_op("nat", "CNI-abc", OWNER, "c")])
    assert restore_text([chain_op("nat", "CNI-abc", OWNER, "chain", "masq")]) == "*nat\n-F CNI-abc\n-X CNI-abc\nCOMMIT\n"


def test_a_native_rule_goes_back_without_its_handle_in_the_deletions_transaction_form():
    rule = {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 41, "comment": "alloc-1",
            "expr": [{"dnat": {"addr": "10.0.0.2", "port": 80}}]}
    add = adding(rule, OWNER, "dnat")
    delete = NativeOp("ip", "cni_hostport", "hostports", 7, OWNER, "dnat", "dnat")
    doc = json.loads(json_script([add, delete]))
    assert doc == {"nftables": [
        {"add": {"rule": {k: v for k, v in rule.items() if k != "handle"}}},
        {"delete": {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 7}}}]}
    assert add != adding(dict(rule, comment="alloc-2"), OWNER, "dnat"), "two rules are two operations"


def test_the_backends_offer_no_other_way_to_write():
    """Their public surface: the interface (read, apply) and the readers the ADD's look runs at once."""
    def public(cls):
        return {n for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n))}

    assert public(SaveRestoreBackend) == {"read", "apply", "save_argv"}
    assert public(NftBackend) == {"read", "apply", "tables", "foreign_tables", "listings", "parsed"}
