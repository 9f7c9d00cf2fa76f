"""The native nftables tables of the reference plugins 1.6 and later, as cni-reaper reads and deletes them:
their rules parsed from `nft -j` output, and the deletions (by handle, one `nft -f` transaction).

- bridge (`"ipMasqBackend": "nftables"`): table `inet cni_plugins_masquerade`, chain `masq_checks`, per
  attachment `ip saddr <ip> ip daddr != <subnet> masquerade comment "<hash(N)>-<hash(IF:X)>, net: N, if: IF,
  id: X"` (and the ip6 twin);
- portmap (`"backend": "nftables"`): tables `ip cni_hostport` and `ip6 cni_hostport`, chains `hostports` and
  `hostip_hostports` (`tcp dport P dnat to <ip>:<port> comment "X"`) and `masquerading` (`ip saddr <ip> ip daddr
  <ip> masquerade comment "X"`, and from 127.0.0.1).
The tables, their hook chains and every rule without such a comment belong to everyone and are never deleted.
"""

from __future__ import annotations

from cni_reaper import jsonio
from cni_reaper.reap.netfilter.chains import sha512
from cni_reaper.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MASQ_TABLE = ("inet", "cni_plugins_masquerade")
MASQ_CHAIN = "masq_checks"
HOSTPORT_TABLES = (("ip", "cni_hostport"), ("ip6", "cni_hostport"))
DNAT_CHAINS = ("hostports", "hostip_hostports")
HOSTPORT_MASQ_CHAIN = "masquerading"
TABLES = (MASQ_TABLE, *HOSTPORT_TABLES)


def _hash(text: str) -> str:
    return sha512(text.encode()).hexdigest()[:16]


def masq_hash(network: str, ifname: str, container_id: str) -> str:
    """The start of the comment bridge gives an attachment's native masquerade rules (hashForInstance)."""
    return f"{_hash(network)}-{_hash(ifname + ':' + container_id)}"


def masq_owner(comment: str) -> tuple[str, str, str] | None:
    """(network, ifname, container ID) a native masquerade comment names, when its hash proves it (a cut
    comment, or a look-alike, names nothing)."""
    head, sep, rest = comment.partition(", net: ")
    network, sep2, rest = rest.partition(", if: ")
    ifname, sep3, cid = rest.partition(", id: ")
    if not (sep and sep2 and sep3) or masq_hash(network, ifname, cid) != head:
        return None
    return network, ifname, cid


class NativeRule(Value):
    __slots__ = ("action", "chain", "comment", "daddr", "dnat_addr", "family", "handle", "raw", "saddr", "table", "text")
    _uncompared = ("text",)

    def __init__(self, family: str, table: str, chain: str, handle: int, comment: str | None, saddr: str | None,
                 daddr: str | None, dnat_addr: str | None, action: str | None, raw: Any) -> None:
        self.family = family  # the table's family: inet, ip, ip6
        self.table, self.chain, self.handle, self.comment = table, chain, handle, comment
        self.saddr = saddr  # `ip saddr X` / `ip6 saddr X`
        self.daddr = daddr  # `ip daddr X` (an exact address; a prefix or a negation is not kept)
        self.dnat_addr = dnat_addr  # `dnat to X:port`
        self.action = action  # "masquerade", "dnat", "redirect", or None
        self.raw = raw  # the rule as nft -j gave it (what undo adds back)
        self.text: str | None = None  # and its JSON text as nft printed it, when read so (what the journal writes)


def _match_addr(expr: dict, field: str) -> str | None:
    m = expr.get("match")
    if not isinstance(m, dict) or m.get("op") != "==":
        return None
    left = m.get("left")
    payload = left.get("payload") if isinstance(left, dict) else None
    if isinstance(payload, dict) and payload.get("protocol") in ("ip", "ip6") and payload.get("field") == field:
        right = m.get("right")
        return right if isinstance(right, str) else None
    return None


def parse_rule(rule: dict) -> NativeRule | None:
    try:
        exprs = rule.get("expr") or []
        saddr = daddr = dnat = action = None
        for e in exprs:
            if not isinstance(e, dict):
                continue
            saddr = saddr or _match_addr(e, "saddr")
            daddr = daddr or _match_addr(e, "daddr")
            if "masquerade" in e:
                action = "masquerade"
            elif "redirect" in e:
                action = "redirect"
            elif isinstance(e.get("dnat"), dict):
                action = "dnat"
                addr = e["dnat"].get("addr")
                dnat = addr if isinstance(addr, str) else None
        comment = rule.get("comment")
        return NativeRule(str(rule["family"]), str(rule["table"]), str(rule["chain"]), int(rule["handle"]),
                          comment if isinstance(comment, str) else None, saddr, daddr, dnat, action, rule)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def parse_listing(text: str) -> list[NativeRule]:
    """The rules of `nft -j list table ...` output, each with its own JSON text (ValueError when it is no JSON;
    RecursionError when nested too deep)."""
    items = jsonio.tagged_items(text, "nftables")
    if items is None:
        return parse_json(jsonio.loads(text))
    out = []
    for tag, value, raw in items:
        if tag == "rule" and isinstance(value, dict):
            rule = parse_rule(value)
            if rule is not None:
                rule.text = raw if jsonio.raw_line(raw) else None
                out.append(rule)
    return out


def parse_json(doc: dict) -> list[NativeRule]:
    """The rules of `nft -j list table ...` output."""
    out = []
    for item in doc.get("nftables", []) if isinstance(doc, dict) else []:
        if isinstance(item, dict) and isinstance(item.get("rule"), dict):
            rule = parse_rule(item["rule"])
            if rule is not None:
                out.append(rule)
    return out


class NativeOp(Value):
    """Delete one rule by its handle; or, for undo, add one back (`rule`: the rule as nftables JSON, without
    its handle, as a jsonio text; "" for a deletion)."""

    __slots__ = ("chain", "family", "handle", "owner", "part", "rule", "table", "what")

    def __init__(self, family: str, table: str, chain: str, handle: int, owner: tuple[str, str], what: str,
                 part: str, rule: str = "") -> None:
        self.family, self.table, self.chain, self.handle, self.owner, self.what = family, table, chain, handle, owner, what
        self.part = part  # "masq" (bridge's) or "dnat" (portmap's)
        self.rule = rule


def adding(rule: dict, owner: tuple[str, str], what: str) -> NativeOp:
    """The op that adds `rule` (nftables JSON, as `nft -j list` gave it) back, without its handle."""
    bare = {k: v for k, v in rule.items() if k != "handle"}
    return NativeOp(str(bare.get("family", "")), str(bare.get("table", "")), str(bare.get("chain", "")), 0, owner,
                    what, "", jsonio.dumps(bare))


def script(ops: list[NativeOp]) -> str:
    """The `nft -f` input of deletions in one transaction (all or nothing)."""
    return "".join(f"delete rule {o.family} {o.table} {o.chain} handle {o.handle}\n" for o in ops)


def json_script(ops: list[NativeOp]) -> str:
    """The `nft -j -f` input that applies `ops`, adds among them, in one transaction (all or nothing)."""
    items = [{"add": {"rule": jsonio.loads(o.rule)}} if o.rule else
             {"delete": {"rule": {"family": o.family, "table": o.table, "chain": o.chain, "handle": o.handle}}}
             for o in ops]
    return jsonio.dumps({"nftables": items})
