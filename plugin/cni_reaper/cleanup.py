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

from . import log
from .hostlocal import NetworkDir, all_network_names, locked_networks
from .plan import Target, plan
from .record import ips, key

APPLY_ATTEMPTS = 3


@dataclass
class Outcome:
    removed: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    failed: set[tuple[str, str, str]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    backends: dict[int, str] = field(default_factory=dict)  # family -> backend name

    @property
    def backend(self) -> str:
        """The backend used, or one per family when they differ: "ipv4: python-iptables, ipv6: ..."."""
        names = set(self.backends.values())
        if len(names) <= 1:
            return names.pop() if names else ""
        return ", ".join(f"ipv{f}: {n}" for f, n in sorted(self.backends.items()))

    def note(self, key, what: str) -> None:
        self.removed.setdefault(key, []).append(what)


def _protected(targets: list[Target], live_records, dirs: dict[str, NetworkDir], fresh_owner_ok) -> dict:
    """Per target: those of its dead IPs whose untagged (firewall) rules must stay, because a live
    attachment holds the IP or host-local has given it to another container."""
    live_ips: dict[str, set] = {}
    for rec in live_records:
        for ip in ips(rec["current"]):
            live_ips.setdefault(ip, set()).add(key(rec))
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


def clean(targets: list[Target], live_records, conf, backend_for=None, tombstoned_keys=frozenset(),
          dry_run: bool = False) -> Outcome:
    """Remove what `targets` left behind, in both families, and their reservations. Never raises: failures
    are logged and reported in the outcome (the caller keeps the record for a retry). `live_records` hold
    addresses that must stay protected; `backend_for(family)` gives the backend (default: netfilter.select);
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
                protected = _protected(targets, live_records, all_dirs, fresh_owner_ok)
                _clean_netfilter(targets, protected, conf, backend_for, outcome, dry_run)
                for t in targets:
                    # after a finished DEL host-local has released X's addresses: any naming X now are a newer life's
                    if "reservation" not in t.parts or t.key in tombstoned_keys:
                        continue
                    for ip in sorted(t.dead_ips):
                        d = dirs[t.network]
                        act = d.would_release if dry_run else d.release
                        if act(ip, t.container_id, t.ifname):
                            outcome.note(t.key, f"host-local reservation {t.network}/{ip}")
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


def _clean_netfilter(targets, protected, conf, backend_for, outcome: Outcome, dry_run: bool = False) -> None:
    """Each family on its own backend: the flavour of its own tool (iptables, ip6tables), as the plugins
    that made the rules chose it."""
    from .netfilter import BackendError, LockHeld, select

    wanted = [t for t in targets if t.parts & {"masq", "dnat", "forward"}]
    if not wanted:
        return
    owners = {(t.network, t.container_id): t.key for t in wanted}
    known = {6 if ":" in ip else 4 for t in wanted for ip in t.dead_ips}
    for family in _families(wanted):
        try:
            backend = backend_for(family) if backend_for else select(conf.backend, family)
        except BackendError as exc:
            if family in known:  # rules of this family exist (a dead IP of it), and nothing can read them
                outcome.errors.append(f"ipv{family}: {exc}")
                outcome.failed |= {t.key for t in wanted}
            continue  # otherwise: no tool, so no plugin made rules in this family
        outcome.backends[family] = backend.name
        last_error = None
        for _attempt in range(APPLY_ATTEMPTS):
            try:
                tables = backend.read(family)
                p = plan(tables, wanted, family, protected)
                del tables  # the plan keeps what it needs; a backend may read the tables again to apply
                if p.ops and not dry_run:
                    backend.apply(family, p.ops)
                for op in p.ops:
                    outcome.note(owners[op.owner], f"ipv{family} {op.table} {op.chain}: {op.what}")
                outcome.skipped += p.skipped
                last_error = None
                break
            except LockHeld as exc:  # someone holds the tables: no point in retrying now; a later call will
                outcome.errors.append(f"ipv{family}: {exc}")
                outcome.failed |= {t.key for t in wanted}
                last_error = None
                break
            except BackendError as exc:  # a concurrent writer changed the table: re-read and retry
                last_error = exc
        if last_error is not None:
            _apply_one_by_one(backend, family, wanted, protected, outcome)


def _apply_one_by_one(backend, family, targets, protected, outcome: Outcome) -> None:
    """The transaction kept failing: apply each operation alone so that one stubborn rule does not keep the
    rest. Whatever fails is logged and the owner's record is kept for a later retry."""
    from .netfilter import BackendError

    try:
        p = plan(backend.read(family), targets, family, protected)
    except BackendError as exc:
        outcome.errors.append(f"ipv{family}: {exc}")
        outcome.failed |= {t.key for t in targets}
        return
    owners = {(t.network, t.container_id): t.key for t in targets}
    for op in p.ops:
        owner = owners[op.owner]
        try:
            backend.apply(family, [op])
            outcome.note(owner, f"ipv{family} {op.table} {op.chain}: {op.what}")
        except BackendError as exc:
            outcome.errors.append(f"ipv{family} {op.table} {op.chain} ({op.what}): {exc}")
            outcome.failed.add(owner)
    outcome.skipped += p.skipped
