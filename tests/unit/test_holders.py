"""The one holder check undo asks (reap/holders.py): what addresses a rule names and what host ports it maps,
read from the parsed rule in both worlds and both families, and who maps a host port now."""

from __future__ import annotations

import pytest

from cni_reaper.reap.holders import HostPort, PortMap, address, native_addresses, native_ports, rule_addresses, rule_ports
from cni_reaper.reap.netfilter.iptables.rules import Table, parse_rule
from cni_reaper.reap.netfilter.nftables.rules import parse_rule as parse_native


@pytest.mark.parametrize("text,want", [("10.0.0.2", "10.0.0.2"), ("10.0.0.2/32", "10.0.0.2"), ("10.0.0.2:80", "10.0.0.2"),
                                       ("[fd00::2]:80", "fd00::2"), ("fd00:0::2/128", "fd00::2"), ("FD00::2", "fd00::2"),
                                       ("::ffff:10.0.0.2", "::ffff:10.0.0.2"), ("eth0", None), ("", None)])
def test_an_address_in_any_of_the_forms_rules_print_it_is_canonical(text, want):
    assert address(text) == want


def test_iptables_rules_name_their_addresses_and_ports():
    dnat = parse_rule("CNI-DN-x", "-s 172.26.64.0/20 -p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd00::2]:80")
    assert rule_addresses(dnat) == {"172.26.64.0", "fd00::2"}
    jump = parse_rule("CNI-HOSTPORT-DNAT", '-d 10.1.1.1/32 -p udp -m comment --comment "dnat name: \\"n\\" id: \\"a\\"" '
                                           "-m multiport --dports 8080,9000:9002 -j CNI-DN-x")
    assert rule_ports(jump) == {HostPort("udp", p, "10.1.1.1") for p in (8080, 9000, 9001, 9002)}
    negated = parse_rule("CNI-HOSTPORT-DNAT", "! -p tcp --dports 53 -j X")
    assert rule_ports(negated) == {HostPort("", 53)}


def test_native_rules_name_their_addresses_and_ports_in_every_shape():
    def rule(chain, *expr, comment="b"):
        return parse_native({"family": "ip6", "table": "cni_hostport", "chain": chain, "handle": 1, "comment": comment,
                             "expr": list(expr)})

    def match(left, right):
        return {"match": {"op": "==", "left": left, "right": right}}

    dnat = {"dnat": {"addr": "fd00::9", "port": 80}}
    plain = rule("hostports", match({"payload": {"protocol": "tcp", "field": "dport"}}, 8080), dnat)
    assert native_ports(plain) == {HostPort("tcp", 8080)} and native_addresses(plain) == {"fd00::9"}
    th = rule("hostports", match({"meta": {"key": "l4proto"}}, "sctp"),
              match({"payload": {"protocol": "th", "field": "dport"}}, {"set": [80, {"range": [90, 91]}]}), dnat)
    assert native_ports(th) == {HostPort("sctp", p) for p in (80, 90, 91)}
    on_ip = rule("hostip_hostports", match({"payload": {"protocol": "ip6", "field": "daddr"}}, "fd00::1"),
                 match({"payload": {"protocol": "udp", "field": "dport"}}, 53), dnat)
    assert native_ports(on_ip) == {HostPort("udp", 53, "fd00::1")}
    assert native_addresses(on_ip) == {"fd00::1", "fd00::9"}


def test_a_host_port_is_shadowed_only_by_another_containers_mapping_of_it():
    ports = PortMap()
    nat = Table("nat", {"CNI-HOSTPORT-DNAT": [parse_rule(
        "CNI-HOSTPORT-DNAT", '-p tcp -m comment --comment "dnat name: \\"n\\" id: \\"live\\"" -m multiport --dports 8080 -j X')]})
    ports.add_iptables({"nat": nat})
    assert ports.shadowed({HostPort("tcp", 8080)}, "dead") == "host port 8080/tcp is mapped by another allocation now"
    assert ports.shadowed({HostPort("tcp", 8080, "10.0.0.1")}, "dead")  # a host IP's mapping shadows too
    assert ports.shadowed({HostPort("udp", 8080)}, "dead") is None
    assert ports.shadowed({HostPort("tcp", 8080)}, "live") is None  # its own


def test_a_failed_transaction_puts_back_none_of_its_rules_and_says_why(monkeypatch):
    from cni_reaper.reap import undo
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.nftables import backend
    from cni_reaper.state.journal import Removed

    class Nft:
        def read(self):
            return []

        def apply(self, ops):
            assert ops and all(op.rule for op in ops), "a put-back adds, through the clean-up's apply"
            raise BackendError("refused")

    class Nobody:
        def of(self, addresses):
            return None

    monkeypatch.setattr(backend, "NftBackend", Nft)
    rule = {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 41, "comment": "alloc-1",
            "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}},
                     {"dnat": {"addr": "10.0.0.2", "port": 80}}]}
    item = {"kind": "nft", "family": "ip", "table": "cni_hostport", "chain": "hostports", "rule": rule, "what": "x"}
    report = undo.Report()
    undo._native([Removed({"id": "e"}, 0, item)], Nobody(), PortMap(), report, dry_run=False)
    assert report.restored == [] and [why for _, why in report.refused] == ["nft: refused"]


def test_a_journaled_native_rule_broader_than_the_plugins_make_is_not_put_back(monkeypatch):
    """Red team: a damaged journal item whose DNAT lost its port match (or a masquerade its address) would catch
    every packet once added back; undo refuses it."""
    from cni_reaper.reap import undo
    from cni_reaper.reap.netfilter.nftables import backend
    from cni_reaper.state.journal import Removed

    added: list = []

    class Nft:
        def read(self):
            return []

        def add(self, rules):
            added.extend(rules)

    class Nobody:
        def of(self, addresses):
            return None

    monkeypatch.setattr(backend, "NftBackend", Nft)
    no_port = {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 4, "comment": "alloc-1",
               "expr": [{"dnat": {"addr": "10.0.0.2"}}]}
    no_address = {"family": "inet", "table": "cni_plugins_masquerade", "chain": "masq_checks", "handle": 5,
                  "comment": "x", "expr": [{"masquerade": None}]}
    report = undo.Report()
    for i, rule in enumerate((no_port, no_address)):
        item = {"kind": "nft", "family": rule["family"], "table": rule["table"], "chain": rule["chain"], "rule": rule,
                "what": "x"}
        undo._native([Removed({"id": "e"}, i, item)], Nobody(), PortMap(), report, dry_run=False)
    assert added == [] and len(report.refused) == 2 and all(why == undo.BROADER for _, why in report.refused)


def test_a_second_look_that_fails_is_tried_once_for_all_the_clashes_and_each_warns():
    """orphans.report reads the tables again before it says another's DNAT stays: once for every clash (a
    reader that fails is not asked again per clash, each then a table read of its own)."""
    from cni_reaper.reap.holders import HostPort, Mapping
    from cni_reaper.reap.orphans import Shadows, report

    shadows = Shadows()
    shadows.clashes = [Mapping(HostPort("tcp", p), f"other-{p}", "nomad") for p in (8080, 8081, 8082)]
    asked = []

    def look_again():
        asked.append(1)
        raise OSError("no nft")

    report(shadows, None, "mine", look_again)
    assert asked == [1]
