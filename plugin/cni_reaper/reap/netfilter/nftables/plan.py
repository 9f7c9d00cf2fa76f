"""What to delete in the native nftables tables of plugins 1.6 and later: pure planning over parsed rules
(rules.py), nothing here touches the kernel."""

from __future__ import annotations

from cni_reaper.reap.netfilter.nftables import rules as native
from cni_reaper.reap.netfilter.nftables.rules import NativeOp, NativeRule
from cni_reaper.reap.targets import Target


class NativePlan:
    __slots__ = ("held", "ops", "skipped")

    def __init__(self) -> None:
        self.ops: list[NativeOp] = []
        self.skipped: list[str] = []
        self.held: dict[tuple[str, str], str] = {}  # no native rule is ever held by something not ours


class _Native:
    """The plan being made: the rules by kind, and the deletions so far (each rule once)."""

    def __init__(self, rules: list[NativeRule]) -> None:
        self.out = NativePlan()
        self.masq = [r for r in rules if (r.family, r.table) == native.MASQ_TABLE and r.chain == native.MASQ_CHAIN
                     and r.action == "masquerade" and r.comment]
        self.masq_by_hash: dict[str, list[NativeRule]] = {}  # the comment's first field: one dict, not a scan per target
        for r in self.masq:
            self.masq_by_hash.setdefault((r.comment or "").split(",", 1)[0], []).append(r)
        self._masq_by_owner: dict[tuple[str, str], list[NativeRule]] | None = None
        self.by_comment: dict[str, list[NativeRule]] = {}
        for r in rules:
            if (r.family, r.table) in native.HOSTPORT_TABLES and r.comment:
                self.by_comment.setdefault(r.comment, []).append(r)
        self.seen: set[tuple[str, str, int]] = set()

    def delete(self, r: NativeRule, owner: tuple[str, str], what: str, part: str) -> None:
        if (r.family, r.table, r.handle) not in self.seen:
            self.seen.add((r.family, r.table, r.handle))
            self.out.ops.append(NativeOp(r.family, r.table, r.chain, r.handle, owner, what, part))

    def masquerade(self, t: Target) -> None:
        """bridge's rule is the target's when its comment carries the target's hash (network, ifname,
        container ID), or names it and proves it by the hash (an attachment known only by its tags)."""
        if t.ifname:
            h = native.masq_hash(t.network, t.ifname, t.container_id)
            mine = [r for r in self.masq_by_hash.get(h, []) if (r.comment or "").startswith(h + ",")]
        else:
            mine = self._by_owner().get((t.network, t.container_id), [])
        for r in mine:
            if t.any_source or r.saddr in t.dead_ips:
                self.delete(r, (t.network, t.container_id), f"native masquerade for {r.saddr}", "masq")

    def _by_owner(self) -> dict[tuple[str, str], list[NativeRule]]:
        """The masquerade rules whose comment names and proves its owner, by (network, container ID)."""
        if self._masq_by_owner is None:
            self._masq_by_owner = {}
            for r in self.masq:
                who = native.masq_owner(r.comment or "")
                if who is not None:
                    self._masq_by_owner.setdefault((who[0], who[2]), []).append(r)
        return self._masq_by_owner

    def hostports(self, t: Target) -> None:
        """portmap's rules carry the container ID; the target's DNAT or masquerade to one of its dead addresses."""
        owner = (t.network, t.container_id)
        for r in self.by_comment.get(t.container_id, []):
            if r.chain in native.DNAT_CHAINS and r.action == "dnat" and r.dnat_addr in t.dead_ips:
                self.delete(r, owner, f"native DNAT to {r.dnat_addr}", "dnat")
            elif r.chain == native.HOSTPORT_MASQ_CHAIN and r.action == "masquerade" and r.daddr in t.dead_ips:
                self.delete(r, owner, f"native hostport masquerade for {r.daddr} from {r.saddr}", "dnat")


def plan_native(rules: list[NativeRule], targets: list[Target]) -> NativePlan:
    """Deletions in the plugins' native tables (rules.py says which): bridge's masquerade rules and portmap's
    DNAT and masquerade rules of the targets' dead addresses. Every other rule, chain and table stays."""
    p = _Native(rules)
    for t in targets:
        if "masq" in t.parts:
            p.masquerade(t)
        if "dnat" in t.parts:
            p.hostports(t)
    return p.out


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


def hostport_owners(rules: list[NativeRule]) -> dict[str, set[str]]:
    """Container ID -> the addresses of portmap's native rules that name it (DNAT targets, hostport
    masquerade destinations). They name no network: the caller finds it (orphans.tagged)."""
    out: dict[str, set[str]] = {}
    for r in rules:
        if (r.family, r.table) in native.HOSTPORT_TABLES and r.comment:
            if r.chain in native.DNAT_CHAINS and r.action == "dnat" and r.dnat_addr:
                out.setdefault(r.comment, set()).add(r.dnat_addr)
            elif r.chain == native.HOSTPORT_MASQ_CHAIN and r.action == "masquerade" and r.daddr:
                out.setdefault(r.comment, set()).add(r.daddr)
    return out
