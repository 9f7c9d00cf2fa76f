"""What to delete: pure planning over parsed tables. Nothing here touches the kernel or the disk.

Given the saved nat and filter tables of one family and the dead lives to clean (Targets), produce the
operations that remove exactly what those lives left behind:

- masquerade (bridge ipMasq): jumps tagged `name: "N" id: "X"` into CNI-<hash>, for the dead IPs only; the
  chain itself when the attachment is wholly dead, every rule in it carries that tag, and nothing else
  jumps to it after the deletions;
- DNAT (portmap): the jumps tagged `dnat name: "N" id: "X"` into CNI-DN-<hash> and the chain, when the chain
  only forwards to IPs of X's dead lives (of every ifname of X cleaned in this plan: the chain is X's in
  the network, whatever the ifname); otherwise only its DNAT rules to dead IPs (a newer life of X uses the
  chain), and when no other life of X holds the chain what else it forwards to is not ours: held (its record
  stays, looked at again later); the old CNI-SN-<hash> chain and its tagged jumps likewise;
- firewall: the two untagged CNI-FORWARD rules of a dead IP, in exactly the firewall plugin's shape, unless
  the IP is protected (held by a live attachment or reserved by someone else).
Shared chains and anything not matching these shapes are never touched.
"""

from __future__ import annotations

from cni_reaper.reap.netfilter import chains
from cni_reaper.reap.netfilter.iptables.rules import Op, Rule, Table, chain_op, rule_op
from cni_reaper.reap.targets import Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.values import Key


def parse_tag(comment: str) -> tuple[str | None, str, str] | None:
    """(kind: None, "dnat" or "snat"; network; container ID) of a comment in the plugins' tag shape
    `[dnat |snat ]name: "N" id: "X"` (N and X without quotes), else None. Cut by hand: `re` costs a clean-up
    a few ms to import."""
    kind = None
    if comment.startswith(("dnat ", "snat ")):
        kind, comment = comment[:4], comment[5:]
    if len(comment) < 8 or not comment.startswith('name: "') or not comment.endswith('"'):
        return None
    network, sep, cid = comment[7:-1].partition('" id: "')
    if not sep or '"' in network or '"' in cid:
        return None
    return kind, network, cid


class Plan:
    __slots__ = ("held", "ops", "skipped")

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.skipped: list[str] = []  # what was left on purpose, and why
        # owner -> why: a dead chain left because something not ours holds it (a rule of someone else's jumps
        # to it, or is in it): its record stays and a later sweep looks again
        self.held: dict[tuple[str, str], str] = {}


def _family_ips(ips: frozenset[str], family: int) -> set[str]:
    return {ip for ip in ips if (":" in ip) == (family == 6)}


def _host_prefix(family: int) -> int:
    return 32 if family == 4 else 128


class _Builder:
    def __init__(self, tables: dict[str, Table], family: int) -> None:
        self.tables = tables
        self.family = family
        self.plan = Plan()
        self._rule_ops: set[int] = set()  # id() of rules already planned
        self._chains: set[tuple[str, str]] = set()
        self._forward_shapes: dict[tuple[str, ...], tuple[str, tuple[str, str]]] = {}
        # (network, container ID) -> the dead IPs of this family of every whole target of it with a DNAT part
        self.whole_dead: dict[tuple[str, str], set[str]] = {}

    def delete_rule(self, table: str, rule: Rule, owner: tuple[str, str], what: str, part: str) -> None:
        if id(rule) in self._rule_ops:
            return
        self._rule_ops.add(id(rule))
        self.plan.ops.append(rule_op(table, rule, owner, what, part))

    def remaining_refs(self, table: Table, chain: str) -> list[Rule]:
        return [r for r in table.references(chain) if id(r) not in self._rule_ops and r.chain != chain]

    def delete_chain(self, table_name: str, chain: str, owner: tuple[str, str], tag: str | None, what: str,
                     part: str) -> None:
        table = self.tables.get(table_name)
        if table is None or chain not in table.chains or (table_name, chain) in self._chains:
            return
        if chain in chains.SHARED or chain in table.builtin:
            return
        refs = self.remaining_refs(table, chain)
        if refs:
            self._hold(owner, f"{table_name} {chain}: still referenced by {len(refs)} rule(s) we do not own")
            return
        if tag is not None:
            foreign = [r for r in table.chains[chain] if r.comment != tag]
            if foreign:
                self._hold(owner, f"{table_name} {chain}: holds {len(foreign)} rule(s) without its owner tag")
                return
        self._chains.add((table_name, chain))
        self.plan.ops.append(chain_op(table_name, chain, owner, what, part))

    def _hold(self, owner: tuple[str, str], why: str) -> None:
        self.plan.skipped.append(why)
        self.plan.held[owner] = why

    # -- per artifact -----------------------------------------------------------------------------
    def masq(self, t: Target, ips: set[str]) -> None:
        nat = self.tables.get("nat")
        if nat is None:
            return
        chain = chains.masq_chain(t.network, t.container_id)
        tag = chains.masq_comment(t.network, t.container_id)
        owner = (t.network, t.container_id)
        for rule in nat.references(chain):
            if rule.chain != chain and rule.comment == tag and (t.any_source or rule.source_ip in ips):
                self.delete_rule("nat", rule, owner, f"masquerade jump for {rule.source}", "masq")
        if t.whole and not t.keep_masq_chain:
            self.delete_chain("nat", chain, owner, tag, "masquerade chain", "masq")

    def dnat(self, t: Target, ips: set[str]) -> None:
        nat = self.tables.get("nat")
        if nat is None:
            return
        owner = (t.network, t.container_id)
        chain = chains.dnat_chain(t.network, t.container_id)
        tag = chains.dnat_comment(t.network, t.container_id)
        inside = nat.chains.get(chain, [])
        dests = {r.dnat_ip for r in inside if r.target == "DNAT"}
        dead = self.whole_dead.get(owner, set())
        if t.whole and (t.any_source or dests <= dead):
            self._tagged_chain(nat, chain, tag, owner, "hostport DNAT")
        else:
            self._dead_dnats(inside, ips, owner)
            if t.whole and chain in nat.chains:  # no other life of X holds the chain: the rest is not ours
                self._hold(owner, f"nat {chain}: DNATs to {len(dests - dead)} address(es) of no dead life of it")
        if t.whole:
            schain = chains.snat_chain(t.network, t.container_id)
            self._tagged_chain(nat, schain, chains.snat_comment(t.network, t.container_id), owner, "old hostport SNAT")

    def _dead_dnats(self, inside: list, ips: set[str], owner: tuple[str, str]) -> None:
        """The DNAT rules of a container's chain to its dead addresses (another life of it holds the chain)."""
        for rule in inside:
            if rule.target == "DNAT" and rule.dnat_ip in ips:
                self.delete_rule("nat", rule, owner, f"DNAT to dead {rule.to_destination}", "dnat")

    def _tagged_chain(self, nat: Table, chain: str, tag: str, owner: tuple[str, str], what: str) -> None:
        """A per-container chain of portmap's and the jumps into it that carry its tag."""
        for rule in nat.references(chain):
            if rule.chain != chain and rule.comment == tag:
                self.delete_rule("nat", rule, owner, f"{what} jump", "dnat")
        self.delete_chain("nat", chain, owner, None, f"{what} chain", "dnat")

    def forward(self, t: Target, ips: set[str], protected: set[str]) -> None:
        """Collect the firewall plugin's rule shapes for this target's dead IPs; matched in one pass later."""
        bits = _host_prefix(self.family)
        for ip in ips - protected:
            owner = (t.network, t.container_id)
            self._forward_shapes[("-s", f"{ip}/{bits}", "-j", "ACCEPT")] = (ip, owner)
            self._forward_shapes[("-d", f"{ip}/{bits}", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                                  "-j", "ACCEPT")] = (ip, owner)
        for ip in sorted(ips & protected):
            self.plan.skipped.append(f"filter CNI-FORWARD rules of {ip}: the address is in use by another attachment")

    def finish(self) -> Plan:
        filt = self.tables.get("filter")
        if filt is not None and self._forward_shapes:
            for rule in filt.chains.get("CNI-FORWARD", []):
                hit = self._forward_shapes.get(rule.tokens)
                if hit is not None:
                    self.delete_rule("filter", rule, hit[1], f"firewall rule for {hit[0]}", "forward")
        return self.plan


def plan(tables: dict[str, Table], targets: list[Target], family: int,
         protected: dict[Key, set[str]] | None = None) -> Plan:
    """Operations for one family. `protected[target.key]` are IPs whose untagged rules must stay."""
    b = _Builder(tables, family)
    for t in targets:
        if "dnat" in t.parts and t.whole:
            b.whole_dead.setdefault((t.network, t.container_id), set()).update(_family_ips(t.dead_ips, family))
    for t in targets:
        ips = _family_ips(t.dead_ips, family)
        if "masq" in t.parts:
            b.masq(t, ips)
        if "dnat" in t.parts:
            b.dnat(t, ips)
        if "forward" in t.parts:
            b.forward(t, ips, (protected or {}).get(t.key, set()))
    return b.finish()


def tagged_networks(tables: dict[str, Table]) -> dict[tuple[str, str], set[str]]:
    """(network, container ID) of every rule tagged the way bridge and portmap tag theirs and jumping to the
    chain they would make for that pair, with the source IPs of the masquerade jumps."""
    out: dict[tuple[str, str], set[str]] = {}
    nat = tables.get("nat")
    if nat is None:
        return out
    for rule in nat.rules():
        tag = parse_tag(rule.comment or "")
        if tag is None:
            continue
        kind, network, cid = tag
        expected = {None: chains.masq_chain, "dnat": chains.dnat_chain, "snat": chains.snat_chain}[kind](network, cid)
        if rule.target != expected:
            continue  # a look-alike: tagged, but not jumping to the chain the plugins would make for it
        ips = out.setdefault((network, cid), set())
        if kind is None and rule.source_ip:
            ips.add(rule.source_ip)
    return out
