"""One interface for both netfilter worlds, the way portmap keeps its iptables and nftables backends side by
side: a domain is a set of tables cleaned as one unit with one backend (an iptables family in one flavour, or
the plugins' native nftables tables). The clean-up loop (reap/cleanup.py) reads, plans and applies through
it and never asks which world it is in; applying a plan twice changes nothing the second time (each plan is
made from a fresh read)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from cni_reaper.reap.netfilter.interface import Backend
    from cni_reaper.reap.targets import Target
else:  # plain classes when run: `typing` is not imported by a clean-up (cni_reaper/values.py)
    Protocol = object

from cni_reaper.reap.netfilter.interface import BackendError

# What the metrics count a removal as (state/counters.KINDS), by part (targets.PARTS)
IPTABLES_KINDS = {"masq": "masquerade", "dnat": "dnat", "forward": "firewall"}
NATIVE_KINDS = {"masq": "nftables_masquerade", "dnat": "nftables_dnat"}


class Plan(Protocol):
    ops: list[Any]
    skipped: list[str]
    held: dict[tuple[str, str], str]  # owner -> why a leftover of it is held by something not ours


class Domain(Protocol):
    label: str
    backend_name: str
    kinds: dict[str, str]
    targets: list[Target]

    def read(self) -> Any:
        """A snapshot of the domain's tables."""

    def plan(self, snapshot: Any) -> Plan:
        """The deletions of what `targets` left in `snapshot` (pure)."""

    def apply(self, ops: list[Any]) -> None:
        """Apply in one transaction per table; BackendError if one failed (nothing of it applied)."""

    def journal(self, snapshot: Any, ops: list[Any]) -> list[dict[str, Any]]:
        """For each op, what putting it back takes (state/journal.py)."""


class IptablesDomain:
    def __init__(self, family: int, backend: Backend, targets: list[Target], protected: dict) -> None:
        self.family, self.backend, self.targets, self.protected = family, backend, targets, protected
        self.label = f"ipv{family}"
        self.backend_name = backend.name
        self.kinds = IPTABLES_KINDS

    def read(self) -> Any:
        return self.backend.read(self.family)

    def plan(self, snapshot: Any) -> Plan:
        from cni_reaper.reap.netfilter.iptables.plan import plan

        return plan(snapshot, self.targets, self.family, self.protected)

    def apply(self, ops: list[Any]) -> None:
        self.backend.apply(self.family, ops)

    def journal(self, snapshot: Any, ops: list[Any]) -> list[dict[str, Any]]:
        out = []
        for op in ops:
            item = {"kind": "iptables", "family": self.family, "flavour": self.backend.flavour, "table": op.table,
                    "chain": op.chain, "op": op.kind, "what": op.what}
            if op.kind == "rule":
                item.update(spec=op.spec, index=op.index)
            else:
                item["rules"] = [r.spec for r in snapshot[op.table].chains.get(op.chain, [])]
            out.append(item)
        return out


class NativeDomain:
    label = "nft"
    kinds = NATIVE_KINDS

    def __init__(self, backend: Any, targets: list[Target]) -> None:
        self.backend, self.targets = backend, targets
        self.backend_name = "nft"

    def read(self) -> Any:
        return self.backend.read()

    def plan(self, snapshot: Any) -> Plan:
        from cni_reaper.reap.netfilter.nftables.plan import plan_native

        return plan_native(snapshot, self.targets)

    def apply(self, ops: list[Any]) -> None:
        self.backend.apply(ops)

    def journal(self, snapshot: Any, ops: list[Any]) -> list[dict[str, Any]]:
        """Each rule as nft printed it (its text written as it is: jsonio.Raw), its handle with it (undo adds
        it back without: a handle in an add names the rule to add after)."""
        from cni_reaper.jsonio import Raw

        by_handle = {(r.family, r.table, r.handle): r for r in snapshot}
        out = []
        for op in ops:
            found = by_handle.get((op.family, op.table, op.handle))
            raw = getattr(found, "raw", None) or {}
            rule: Any = Raw(found.text, raw) if found is not None and found.text is not None else raw
            out.append({"kind": "nft", "family": op.family, "table": op.table, "chain": op.chain, "rule": rule,
                        "what": op.what})
        return out


def _families(targets: list[Target]) -> list[int]:
    fams = set()
    for t in targets:
        if not t.dead_ips or t.any_source:
            fams |= {4, 6}
        fams |= {6 if ":" in ip else 4 for ip in t.dead_ips}
    return sorted(fams)


def _selected(backend: str, family: int, backend_for: Any, backend_of: Any) -> Backend | BackendError:
    """The iptables backend a target's setting resolves to for `family`, or why there is none."""
    try:
        return backend_for(family) if backend_for else backend_of(backend, family)
    except BackendError as exc:
        return exc


def _unreadable(t: Target, family: int, why: BackendError, errors: list[str], failed: set) -> None:
    """A family whose rules cannot be read: a target with an address of it fails (it is kept)."""
    if any((":" in ip) == (family == 6) for ip in t.dead_ips):
        errors.append(f"ipv{family}: {why}")
        failed.add(t.key)


def domains(targets: list[Target], protected: dict, errors: list[str], failed: set,
            backend_for: Any = None) -> list[Domain]:
    """The domains the targets' leftovers are in: per family, one per iptables flavour the targets' backend
    settings resolve to (each family follows its own tool unless a setting says which), and the native
    tables. A family whose tool is missing has no rules of the plugins, unless a target has an address of
    it (then nothing can be read: an error, and those targets are kept). `backend_for(family | "native")`
    stands in for the real backends (tests)."""
    from cni_reaper.reap.netfilter.select import backend_of

    wanted = [t for t in targets if t.parts & {"masq", "dnat", "forward"}]
    out: list[Domain] = []
    chosen: dict[tuple[str, int], Backend | BackendError] = {}  # one selection per setting and family
    for family in _families(wanted):
        groups: dict[str, tuple[Backend, list[Target]]] = {}
        for t in (t for t in wanted if family in _families([t])):
            b = chosen.get((t.backend, family))
            if (t.backend, family) not in chosen:
                b = chosen[(t.backend, family)] = _selected(t.backend, family, backend_for, backend_of)
            if isinstance(b, BackendError):
                _unreadable(t, family, b, errors, failed)
            elif b is not None:
                groups.setdefault(b.name + "/" + getattr(b, "flavour", ""), (b, []))[1].append(t)
        out += [IptablesDomain(family, b, ts, protected) for b, ts in groups.values()]
    return out + _native_domain(wanted, backend_for)


def _native_domain(wanted: list[Target], backend_for: Any) -> list[Domain]:
    """The plugins' native tables, where a target's masquerade or DNAT may be."""
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend

    native = [t for t in wanted if t.parts & {"masq", "dnat"}]
    nft = backend_for("native") if backend_for else NftBackend()
    return [NativeDomain(nft, native)] if native and nft is not None else []
