"""Finding dead attachments and removing what they left behind: the part that touches the kernel and disk.

Order of locks, always: the state lock (held by the caller) -> host-local's network locks (in name
order) -> the xtables lock (taken by iptables-legacy-restore -w). Every wait is bounded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from . import log, netns
from .hostlocal import NetworkDir, all_network_names, locked_networks
from .plan import PARTS, Target, plan, tagged_ids

TOMBSTONE_GRACE_SECONDS = 60.0
APPLY_ATTEMPTS = 3


# -- classification (stat calls only) ---------------------------------------------------------------
def cache_entry_exists(cache_dir: str, record) -> bool:
    """libcni caches each attachment until its DEL succeeded: `<cacheDir>/results/<N>-<X>-<ifname>`."""
    return os.path.lexists(os.path.join(cache_dir, "results", f"{record.network}-{record.containerID}-{record.ifname}"))


DONE, EXPIRED, WAIT = "tombstone-done", "tombstone-expired", "tombstone-wait"
SWEEPABLE = ("dead", DONE, EXPIRED)


def classify(record, cache_dir: str, now: float | None = None) -> str:
    """live | dead | tombstone-done | tombstone-expired | tombstone-wait."""
    if record.deleted is not None:
        if not cache_entry_exists(cache_dir, record):
            return DONE  # the DEL of the whole chain is over (host-local released the addresses then)
        age = (now or time.time()) - record.deleted.at.timestamp()
        if age > TOMBSTONE_GRACE_SECONDS and not netns.is_alive(record.current.netns, _nsid(record.current)):
            return EXPIRED  # the DEL failed long ago and the namespace is gone: nobody else will tear it down
        return WAIT  # a DEL of this attachment may still be running: bridge needs its chain until it is over
    if netns.is_alive(record.current.netns, _nsid(record.current)):
        return "live"
    return "dead"


def _nsid(inc):
    return (inc.netnsId.dev, inc.netnsId.ino) if inc.netnsId else None


def _ips(incs) -> set[str]:
    return {ip.address for inc in incs for ip in inc.ips}


def targets_for(record, state: str) -> list[Target]:
    if state == WAIT:
        return []
    if state == "live":
        old = _ips(record.earlier) - _ips([record.current])
        if not record.earlier:
            return []
        return [Target(record.network, record.containerID, record.ifname, frozenset(old), whole=False,
                       reason="earlier incarnation")]
    return [Target(record.network, record.containerID, record.ifname,
                   frozenset(_ips([record.current, *record.earlier])), whole=True, reason=state)]


# -- the clean-up -----------------------------------------------------------------------------------
@dataclass
class Outcome:
    removed: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    failed: set[tuple[str, str, str]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    backend: str = ""
    dry_run: bool = False

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.removed.values())

    def note(self, key, what: str) -> None:
        self.removed.setdefault(key, []).append(what)


def _protected(targets: list[Target], live_records, dirs: dict[str, NetworkDir], fresh_owner_ok) -> dict:
    """Per target: those of its dead IPs whose untagged (firewall) rules must stay, because a live
    attachment holds the IP or host-local has given it to another container."""
    live_ips: dict[str, set] = {}
    for rec in live_records:
        for ip in _ips([rec.current]):
            live_ips.setdefault(ip, set()).add(rec.key)
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


def clean(targets: list[Target], live_records, conf, backend=None, tombstoned_keys=frozenset(),
          dry_run: bool = False) -> Outcome:
    """Remove what `targets` left behind, in both families, and their reservations. Never raises for a
    netfilter failure: failures are logged and reported in the outcome (the record stays for a retry).
    With dry_run, plan and report only: nothing is changed."""
    outcome = Outcome(dry_run=dry_run)
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
                _clean_netfilter(targets, protected, conf, backend, outcome, dry_run)
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
    for key, items in outcome.removed.items():
        log.info("removed", network=key[0], containerID=key[1], ifname=key[2], items=items,
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


def _clean_netfilter(targets, protected, conf, backend, outcome: Outcome, dry_run: bool = False) -> None:
    from .netfilter.backend import BackendError, select

    wanted = [t for t in targets if t.parts & {"masq", "dnat", "forward"}]
    if not wanted:
        return
    try:
        backend = backend or select(conf.backend)
        outcome.backend = backend.name
    except BackendError as exc:
        outcome.errors.append(str(exc))
        outcome.failed |= {t.key for t in wanted}
        return
    for family in _families(wanted):
        last_error = None
        for _attempt in range(APPLY_ATTEMPTS):
            try:
                tables = backend.read(family)
                p = plan(tables, wanted, family, protected)
                if p.ops and not dry_run:
                    backend.apply(family, p.ops)
                for op in p.ops:
                    key = next(t.key for t in wanted if (t.network, t.container_id) == op.owner)
                    outcome.note(key, f"ipv{family} {op.table} {op.chain}: {op.what}")
                outcome.skipped += p.skipped
                last_error = None
                break
            except BackendError as exc:  # a concurrent writer changed the table: re-read and retry
                last_error = exc
        if last_error is not None:
            _apply_one_by_one(backend, family, wanted, protected, outcome, last_error)


def _apply_one_by_one(backend, family, targets, protected, outcome: Outcome, first_error) -> None:
    """The transaction kept failing: apply each operation alone so that one stubborn rule does not keep the
    rest. Whatever fails is logged and the owner's record is kept for a later retry."""
    from .netfilter.backend import BackendError

    try:
        p = plan(backend.read(family), targets, family, protected)
    except BackendError as exc:
        outcome.errors.append(f"ipv{family}: {exc}")
        outcome.failed |= {t.key for t in targets}
        return
    for op in p.ops:
        key = next(t.key for t in targets if (t.network, t.container_id) == op.owner)
        try:
            backend.apply(family, [op])
            outcome.note(key, f"ipv{family} {op.table} {op.chain}: {op.what}")
        except BackendError as exc:
            outcome.errors.append(f"ipv{family} {op.table} {op.chain} ({op.what}): {exc}")
            outcome.failed.add(key)
    outcome.skipped += p.skipped


# -- sweeps ------------------------------------------------------------------------------------------
def sweep(store, conf, exclude: frozenset = frozenset(), extra: list[Target] | None = None,
          records=None, dry_run: bool = False, only_network: str | None = None) -> Outcome:
    """Clean every dead record, every ready tombstone and every earlier incarnation; then drop or trim the
    records that were cleaned. Costs one stat per record (plus one per tombstone) when nothing is stale."""
    records = list(store.records()) if records is None else records
    states = {r.key: classify(r, conf.cniCacheDir) for r in records}
    targets: list[Target] = list(extra or [])
    for r in records:
        if r.key in exclude or (only_network and r.network != only_network):
            continue
        targets += targets_for(r, states[r.key])
    if not targets:
        return Outcome(dry_run=dry_run)
    live = [r for r in records if states[r.key] == "live" or r.key in exclude]
    tombstoned = frozenset(r.key for r in records if states[r.key] == DONE)
    outcome = clean(targets, live, conf, tombstoned_keys=tombstoned, dry_run=dry_run)
    if dry_run:
        return outcome
    for r in records:
        if r.key in exclude or r.key in outcome.failed or (only_network and r.network != only_network):
            continue
        state = states[r.key]
        if state in SWEEPABLE:
            store.remove(*r.key)
            log.info("record dropped", network=r.network, containerID=r.containerID, ifname=r.ifname, state=state)
        elif state == "live" and r.earlier:
            r.earlier = []
            store.save(r)
    return outcome


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


__all__ = ["PARTS", "Target", "classify", "clean", "sweep", "targets_for", "tagged_ids"]


def safe_sweep(store, conf, **kw) -> Outcome:
    """sweep() for verbs whose own work is done: nothing it meets fails the verb."""
    try:
        return sweep(store, conf, **kw)
    except Exception as exc:  # noqa: BLE001
        log.warn("sweep failed; will retry on a later call", error=f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        return Outcome(errors=[str(exc)])
