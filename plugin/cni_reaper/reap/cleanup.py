"""The clean-up engine: given the targets (dead lives of attachments), remove what they left behind, in both
families, and their host-local reservations. Which targets there are is the sweep's business (sweep.py);
what exactly to delete is the planner's (plan.py); the kernel is the backends' (netfilter/).

Order of locks, always: the state lock (held by the caller) -> host-local's network locks (in name
order) -> the xtables lock (taken by iptables-legacy-restore -w or around a libiptc commit). Every wait is
bounded. Each family is cleaned through its own backend; a transaction that fails because a concurrent
writer changed the table is re-read, re-planned and retried, then applied one operation at a time, so that
one stubborn rule does not keep the rest; a held xtables lock stops the family's clean-up for this call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cni_reaper import log
from cni_reaper.reap.hostlocal import NetworkDir, all_network_names, locked_networks
from cni_reaper.reap.netfilter.iptables.plan import plan
from cni_reaper.reap.targets import Target

APPLY_ATTEMPTS = 3
# What the metrics count a removal as (metrics.KINDS), by domain and part (plan.PARTS)
IPTABLES_KINDS = {"masq": "masquerade", "dnat": "dnat", "forward": "firewall"}
NATIVE_KINDS = {"masq": "nftables_masquerade", "dnat": "nftables_dnat"}


@dataclass
class Outcome:
    removed: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    failed: set[tuple[str, str, str]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    backends: dict[int, str] = field(default_factory=dict)  # family -> backend name
    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (network, kind) -> items removed

    @property
    def backend(self) -> str:
        """The backend used, or one per family when they differ: "ipv4: python-iptables, ipv6: ..."."""
        names = set(self.backends.values())
        if len(names) <= 1:
            return names.pop() if names else ""
        return ", ".join(f"ipv{f}: {n}" for f, n in sorted(self.backends.items()))

    def note(self, key, what: str, kind: str, n: int = 1) -> None:
        """One removal (or `n` of a kind counted as one line: conntrack entries) of attachment `key`."""
        self.removed.setdefault(key, []).append(what)
        self.counts[(key[0], kind)] = self.counts.get((key[0], kind), 0) + n


def _protected(targets: list[Target], live: dict, dirs: dict[str, NetworkDir], fresh_owner_ok) -> dict:
    """Per target: those of its dead IPs whose untagged (firewall) rules must stay, because a live
    attachment holds the IP or host-local has given it to another container."""
    live_ips: dict[str, set] = {}
    for holder, addresses in live.items():
        for ip in addresses:
            live_ips.setdefault(ip, set()).add(holder)
    out = {}
    for t in targets:
        prot = set()
        for ip in t.dead_ips:
            holders = live_ips.get(ip, set())
            if holders - {t.key} or (not t.whole and t.key in holders):
                prot.add(ip)
                continue
            for d in dirs.values():
                who = d.owner(ip)
                if who is not None and (who[0] != t.container_id or not fresh_owner_ok(t, d.network)):
                    prot.add(ip)
                    break
        out[t.key] = prot
    return out


def clean(targets: list[Target], live: dict, conf, backend_for=None, tombstoned_keys=frozenset(),
          dry_run: bool = False) -> Outcome:
    """Remove what `targets` left behind, in both families, and their reservations. Never raises: failures
    are logged and reported in the outcome (the caller keeps the record for a retry). `live` maps the key of
    every live attachment to the addresses it holds: those stay protected. `backend_for(4 | 6 | "native")`
    gives the backends (default: netfilter.select and the native nftables backend);
    `tombstoned_keys`: attachments whose DEL finished (host-local has released their addresses, so a
    reservation naming them is a newer life's). With dry_run, plan and report only: nothing is changed."""
    outcome = Outcome()
    if not targets:
        return outcome

    networks = sorted({t.network for t in targets})
    other = [n for n in all_network_names(conf.ipamDataDir) if n not in networks]

    def fresh_owner_ok(t: Target, network: str) -> bool:
        # A reservation naming X itself is X's leak, unless X's DEL finished (host-local released X then,
        # so a reservation naming X now belongs to a newer life of X).
        return network == t.network and t.key not in tombstoned_keys

    try:
        with locked_networks(conf.ipamDataDir, networks, conf.lockTimeout) as dirs:
            all_dirs = dict(dirs)
            for n in other:
                all_dirs[n] = NetworkDir(conf.ipamDataDir, n)
            try:
                protected = _protected(targets, live, all_dirs, fresh_owner_ok)
                _clean_netfilter(targets, protected, conf, backend_for, outcome, dry_run)
                _clear_conntrack(targets, protected, outcome, dry_run)
                for t in targets:
                    # after a finished DEL host-local has released X's addresses: any naming X now are a newer life's
                    if "reservation" not in t.parts or t.key in tombstoned_keys:
                        continue
                    for ip in sorted(t.dead_ips):
                        d = dirs[t.network]
                        act = d.would_release if dry_run else d.release
                        if act(ip, t.container_id, t.ifname):
                            outcome.note(t.key, f"host-local reservation {t.network}/{ip}", "reservation")
            finally:
                for n in other:
                    all_dirs[n].close()
    except Exception as exc:  # noqa: BLE001 - the clean-up never breaks a verb
        outcome.errors.append(f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        outcome.failed |= {t.key for t in targets}
    if dry_run:
        return outcome
    for owner, items in outcome.removed.items():
        log.info("removed", network=owner[0], containerID=owner[1], ifname=owner[2], items=items,
                 backend=outcome.backend)
    for msg in outcome.skipped:
        log.info("left in place", why=msg)
    for err in outcome.errors:
        log.warn("clean-up failed; will retry on a later call", error=err)
    return outcome


def _families(targets: list[Target]) -> list[int]:
    fams = set()
    for t in targets:
        if not t.dead_ips or t.any_source:
            fams |= {4, 6}
        fams |= {6 if ":" in ip else 4 for ip in t.dead_ips}
    return sorted(fams)


class _Domain:
    """Tables cleaned as one unit, with one kind of backend: an iptables family (`ipv4`, `ipv6`) or the
    plugins' native nftables tables (`nft`)."""

    def __init__(self, label: str, read, plan_fn, apply, kinds: dict[str, str]) -> None:
        self.label, self.read, self.plan, self.apply, self.kinds = label, read, plan_fn, apply, kinds


def _clean_netfilter(targets, protected, conf, backend_for, outcome: Outcome, dry_run: bool = False) -> None:
    """Each iptables family on its own backend (the flavour of its own tool, as the plugins that made the
    rules chose it), then the native nftables tables. `backend_for(4 | 6 | "native")` may stand in for the
    real backends (tests); it may answer None for a key it does not serve."""
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend
    from cni_reaper.reap.netfilter.nftables.plan import plan_native
    from cni_reaper.reap.netfilter.select import select

    wanted = [t for t in targets if t.parts & {"masq", "dnat", "forward"}]
    if not wanted:
        return
    known = {6 if ":" in ip else 4 for t in wanted for ip in t.dead_ips}
    domains = []
    for family in _families(wanted):
        try:
            backend = backend_for(family) if backend_for else select(conf.backend, family)
        except BackendError as exc:
            if family in known:  # rules of this family exist (a dead IP of it), and nothing can read them
                outcome.errors.append(f"ipv{family}: {exc}")
                outcome.failed |= {t.key for t in wanted}
            continue  # otherwise: no tool, so no plugin made rules in this family
        if backend is None:
            continue
        outcome.backends[family] = backend.name
        domains.append(_Domain(f"ipv{family}", lambda b=backend, f=family: b.read(f),
                               lambda tables, f=family: plan(tables, wanted, f, protected),
                               lambda ops, b=backend, f=family: b.apply(f, ops), IPTABLES_KINDS))
    native = [t for t in wanted if t.parts & {"masq", "dnat"}]
    nft = backend_for("native") if backend_for else NftBackend()
    if native and nft is not None:
        domains.append(_Domain("nft", nft.read, lambda rules: plan_native(rules, native), nft.apply, NATIVE_KINDS))
    for domain in domains:
        _clean_domain(domain, wanted, outcome, dry_run)


def _clean_domain(domain: _Domain, wanted: list[Target], outcome: Outcome, dry_run: bool) -> None:
    """Read, plan, apply in one transaction; on failure (a concurrent writer changed the tables) read, plan and
    try again; then one operation at a time. A held xtables lock stops at once: a later call will retry."""
    from cni_reaper.reap.netfilter.interface import BackendError, LockHeld

    owners = {(t.network, t.container_id): t.key for t in wanted}
    last_error = None
    for _attempt in range(APPLY_ATTEMPTS):
        try:
            p = domain.plan(domain.read())  # the plan keeps what it needs of the tables, not the tables
            if p.ops and not dry_run:
                domain.apply(p.ops)
            for op in p.ops:
                outcome.note(owners[op.owner], f"{domain.label} {op.table} {op.chain}: {op.what}", domain.kinds[op.part])
            outcome.skipped += p.skipped
            return
        except LockHeld as exc:
            outcome.errors.append(f"{domain.label}: {exc}")
            outcome.failed |= {t.key for t in wanted}
            return
        except BackendError as exc:
            last_error = exc
    if last_error is not None:
        _apply_one_by_one(domain, wanted, outcome)


def _apply_one_by_one(domain: _Domain, targets: list[Target], outcome: Outcome) -> None:
    """The transaction kept failing: apply each operation alone so that one stubborn rule does not keep the
    rest. Whatever fails is logged and the owner's record is kept for a later retry."""
    from cni_reaper.reap.netfilter.interface import BackendError

    try:
        p = domain.plan(domain.read())
    except BackendError as exc:
        outcome.errors.append(f"{domain.label}: {exc}")
        outcome.failed |= {t.key for t in targets}
        return
    owners = {(t.network, t.container_id): t.key for t in targets}
    for op in p.ops:
        owner = owners[op.owner]
        try:
            domain.apply([op])
            outcome.note(owner, f"{domain.label} {op.table} {op.chain}: {op.what}", domain.kinds[op.part])
        except BackendError as exc:
            outcome.errors.append(f"{domain.label} {op.table} {op.chain} ({op.what}): {exc}")
            outcome.failed.add(owner)
    outcome.skipped += p.skipped


def _clear_conntrack(targets: list[Target], protected: dict, outcome: Outcome, dry_run: bool) -> None:
    """Once a dead attachment's rules are gone: the conntrack entries whose reply source or original
    destination is one of its dead addresses, never for an address someone else holds (protected)."""
    from cni_reaper.reap import conntrack

    owner_of: dict[str, tuple[str, str, str]] = {}
    for t in targets:
        if "conntrack" in t.parts and t.key not in outcome.failed:
            for ip in t.dead_ips - protected.get(t.key, set()):
                owner_of.setdefault(ip, t.key)
    if not owner_of:
        return
    try:
        counts = conntrack.count(set(owner_of)) if dry_run else conntrack.clear(set(owner_of))
    except conntrack.ConntrackError as exc:
        if exc.errno not in conntrack.UNAVAILABLE:
            outcome.errors.append(f"conntrack: {exc}")  # the entries expire in time; the records are not kept
        return
    for ip, n in sorted(counts.items()):
        outcome.note(owner_of[ip], f"conntrack: {n} entr{'y' if n == 1 else 'ies'} of {ip}", "conntrack", n)
