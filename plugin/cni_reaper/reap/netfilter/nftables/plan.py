"""What to delete in the native nftables tables of plugins 1.6 and later: pure planning over parsed rules
(rules.py), nothing here touches the kernel."""

from __future__ import annotations

from dataclasses import dataclass, field

from cni_reaper.reap.netfilter.nftables import rules as native
from cni_reaper.reap.netfilter.nftables.rules import NativeOp, NativeRule
from cni_reaper.reap.targets import Target


@dataclass
class NativePlan:
    ops: list[NativeOp] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def plan_native(rules: list[NativeRule], targets: list[Target]) -> NativePlan:
    """Deletions in the plugins' native tables (netfilter/native.py says which): a masquerade rule is the
    target's when its comment carries the target's hash (network, ifname, container ID) and its source is
    one of the dead addresses; a portmap rule when its comment is the container ID and it DNATs or
    masquerades to one of the dead addresses. Every other rule, chain and table stays."""
    out = NativePlan()
    masq = [r for r in rules if (r.family, r.table) == native.MASQ_TABLE and r.chain == native.MASQ_CHAIN
            and r.action == "masquerade" and r.comment]
    hostport = [r for r in rules if (r.family, r.table) in native.HOSTPORT_TABLES and r.comment]
    by_comment: dict[str, list[NativeRule]] = {}
    for r in hostport:
        by_comment.setdefault(r.comment or "", []).append(r)
    seen: set[tuple[str, str, int]] = set()

    def delete(r: NativeRule, owner: tuple[str, str], what: str, part: str) -> None:
        if (r.family, r.table, r.handle) not in seen:
            seen.add((r.family, r.table, r.handle))
            out.ops.append(NativeOp(r.family, r.table, r.chain, r.handle, owner, what, part))

    for t in targets:
        owner = (t.network, t.container_id)
        if "masq" in t.parts:
            prefix = native.masq_hash(t.network, t.ifname, t.container_id) + "," if t.ifname else None
            for r in masq:
                comment = r.comment or ""
                mine = comment.startswith(prefix) if prefix else (
                    (native.masq_owner(comment) or ("", "", ""))[0::2] == (t.network, t.container_id))
                if mine and (t.any_source or r.saddr in t.dead_ips):
                    delete(r, owner, f"native masquerade for {r.saddr}", "masq")
        if "dnat" in t.parts:
            for r in by_comment.get(t.container_id, []):
                if r.chain in native.DNAT_CHAINS and r.action == "dnat" and r.dnat_addr in t.dead_ips:
                    delete(r, owner, f"native DNAT to {r.dnat_addr}", "dnat")
                elif r.chain == native.HOSTPORT_MASQ_CHAIN and r.action == "masquerade" and r.daddr in t.dead_ips:
                    delete(r, owner, f"native hostport masquerade for {r.daddr} from {r.saddr}", "dnat")
    return out


def tagged_natively(rules: list[NativeRule]) -> dict[tuple[str, str], set[str]]:
    """(network, container ID) of every native masquerade rule whose comment proves its owner, with the
    rule's source addresses: how attachments cni-reaper never recorded are found in the native tables."""
    out: dict[tuple[str, str], set[str]] = {}
    for r in rules:
        if (r.family, r.table) == native.MASQ_TABLE and r.chain == native.MASQ_CHAIN and r.comment:
            who = native.masq_owner(r.comment)
            if who is not None:
                ips = out.setdefault((who[0], who[2]), set())
                if r.saddr:
                    ips.add(r.saddr)
    return out
