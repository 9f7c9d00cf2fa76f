"""The clean-up engine: given the targets (dead lives of attachments), remove what they left behind, in every
netfilter domain, their conntrack entries and their host-local reservations. Which targets there are is the
sweep's business (sweep.py); what of them someone else may hold, the claims' (claims.py); what exactly to
delete, the planners'; the kernel, the backends'.

Order of locks, always: the state lock (held by the caller) -> host-local's network locks (by data dir, then
network) -> the xtables lock (taken by iptables-legacy-restore -w or around a libiptc commit). Every wait is
bounded. Under host-local's locks: the claims are read, the targets narrowed to what is theirs alone, the
rules removed, the conntrack entries cleared, then, per released address, libcni's cached result of the dead
attachment forgotten and the reservation removed. A transaction that fails because a concurrent writer
changed the tables is re-read, re-planned and retried, then applied one operation at a time, so that one
stubborn rule does not keep the rest; a held xtables lock stops that domain's clean-up for this call.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.reap.netfilter.domain import Domain

from cni_reaper import log
from cni_reaper.reap.claims import Claims
from cni_reaper.reap.hostlocal import NetworkDir, locked_dirs, networks_in
from cni_reaper.reap.outcome import Outcome
from cni_reaper.reap.targets import NETFILTER_PARTS, Target

APPLY_ATTEMPTS = 3


class Settings:
    """What a clean-up needs to know beyond its targets: every data dir where reservations may be (for the
    claims), the lock timeout, and the test hook for backends."""

    def __init__(self, data_dirs: list[str], lock_timeout: float, backend_for: Any = None, dry_run: bool = False) -> None:
        self.data_dirs = list(dict.fromkeys(data_dirs))
        self.lock_timeout, self.backend_for, self.dry_run = lock_timeout, backend_for, dry_run


def clean(targets: list[Target], holders: dict[tuple[str, str, str], set[str]], settings: Settings) -> Outcome:
    """Remove what `targets` left behind. Never raises: failures are logged and reported in the outcome (the
    caller keeps the record for a retry). `holders` maps the key of every attachment that is live, unknown or
    being deleted to the addresses it holds."""
    outcome = Outcome()
    if not targets:
        return outcome
    target_dirs = {(e.data_dir, t.network) for t in targets for e in t.expect.values()}
    target_dirs |= {(d, t.network) for t in targets for d in settings.data_dirs}
    try:
        with locked_dirs(target_dirs, settings.lock_timeout) as dirs:
            others = [NetworkDir(d, n) for d in settings.data_dirs for n in networks_in(d)
                      if (d, n) not in dirs]
            try:
                claims = Claims(targets, holders, [*dirs.values(), *others])
                narrowed, protected = _narrow(targets, claims, outcome)
                _clean_netfilter(narrowed, protected, settings, outcome)
                _clear_conntrack(narrowed, protected, outcome, settings.dry_run)
                _release(narrowed, claims, dirs, outcome, settings.dry_run)
            finally:
                for d in others:
                    d.close()
    except Exception as exc:  # noqa: BLE001 - the clean-up never breaks a verb
        outcome.errors.append(f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        outcome.failed |= {t.key for t in targets}
    if not settings.dry_run:
        _log(outcome)
    return outcome


def _narrow(targets: list[Target], claims: Claims, outcome: Outcome) -> tuple[list[Target], dict]:
    """Each target cut to what is its alone: addresses no other life of its container holds (its tagged rules
    of them), its chains only when no other life of its container is there; `protected[key]`: its addresses
    whose untagged rules and conntrack entries must stay."""
    narrowed, protected = [], {}
    for t in targets:
        kin_free = frozenset(ip for ip in t.dead_ips if claims.kin_free(t, ip))
        whole = t.whole and claims.container_free(t)
        n = t.narrowed(kin_free, whole)
        narrowed.append(n)
        protected[t.key] = {ip for ip in kin_free if not claims.ip_free(t, ip)}
        for ip in sorted(t.dead_ips - kin_free):
            outcome.skipped.append(f"{t.network} {t.container_id} {ip}: {claims.why_kept(t, ip)}")
        if t.whole and not whole:
            outcome.skipped.append(f"{t.network} {t.container_id}: its chains stay, another life of it is there")
    return narrowed, protected


def _log(outcome: Outcome) -> None:
    for owner, items in outcome.removed.items():
        log.info("removed", network=owner[0], containerID=owner[1], ifname=owner[2], items=items,
                 backend=outcome.backend)
    for msg in outcome.skipped:
        log.info("left in place", why=msg)
    for err in outcome.errors:
        log.warn("clean-up failed; will retry on a later call", error=err)


# -- netfilter ------------------------------------------------------------------------------------
def _clean_netfilter(targets: list[Target], protected: dict, settings: Settings, outcome: Outcome) -> None:
    from cni_reaper.reap.netfilter.domain import domains

    wanted = [t for t in targets if t.parts & NETFILTER_PARTS]
    if not wanted:
        return
    for domain in domains(wanted, protected, outcome.errors, outcome.failed, settings.backend_for):
        if domain.label.startswith("ipv"):
            outcome.backends[int(domain.label[3:])] = domain.backend_name
        _clean_domain(domain, outcome, settings.dry_run)


def _owners(domain: Domain) -> dict[tuple[str, str], tuple[str, str, str]]:
    return {(t.network, t.container_id): t.key for t in domain.targets}


def _clean_domain(domain: Domain, outcome: Outcome, dry_run: bool) -> None:
    """Read, plan, apply in one transaction; on failure (a concurrent writer changed the tables) read, plan and
    try again; then one operation at a time. A held xtables lock stops at once: a later call will retry."""
    from cni_reaper.reap.netfilter.interface import BackendError, LockHeld

    owners = _owners(domain)
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
            outcome.failed |= set(owners.values())
            return
        except BackendError:
            continue
    _apply_one_by_one(domain, outcome)


def _apply_one_by_one(domain: Domain, outcome: Outcome) -> None:
    """The transaction kept failing: apply each operation alone so that one stubborn rule does not keep the
    rest. Whatever fails is logged and the owner's record is kept for a later retry."""
    from cni_reaper.reap.netfilter.interface import BackendError

    owners = _owners(domain)
    try:
        p = domain.plan(domain.read())
    except BackendError as exc:
        outcome.errors.append(f"{domain.label}: {exc}")
        outcome.failed |= set(owners.values())
        return
    for op in p.ops:
        owner = owners[op.owner]
        try:
            domain.apply([op])
            outcome.note(owner, f"{domain.label} {op.table} {op.chain}: {op.what}", domain.kinds[op.part])
        except BackendError as exc:
            outcome.errors.append(f"{domain.label} {op.table} {op.chain} ({op.what}): {exc}")
            outcome.failed.add(owner)
    outcome.skipped += p.skipped


# -- conntrack and reservations ------------------------------------------------------------------------
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


def _release(targets: list[Target], claims: Claims, dirs: dict[tuple[str, str], NetworkDir], outcome: Outcome,
             dry_run: bool) -> None:
    """Per dead address that no other life of its container holds: libcni's cached result of the attachment
    forgets it, then its own reservation (if there is one still) is removed. A later DEL of the dead
    attachment (the runtime's, or libcni 1.3's GC) would otherwise hand the address to the firewall plugin,
    which deletes the rules of whoever holds the address by then: the next allocation that got it, from
    cni-reaper's release or from a boot that emptied host-local's directory."""
    for t in targets:
        if "reservation" not in t.parts or t.key in outcome.failed or not t.dead_ips:
            continue
        if not dry_run and not _forget(t, outcome):
            continue
        for ip in sorted(t.dead_ips):
            _verify_dir(t, ip, dirs, outcome)
            for r in claims.releasable(t, ip):
                d = dirs.get((r.data_dir, r.network))
                if dry_run or (d is not None and d.release(r)):
                    outcome.note(t.key, f"host-local reservation {r.network}/{ip}", "reservation")


def _forget(t: Target, outcome: Outcome) -> bool:
    from cni_reaper.reap import cache

    if not t.cache_dir:
        return True
    changed = cache.forget_addresses(t.cache_dir, t.network, t.container_id, t.ifname, set(t.dead_ips))
    if changed is None:
        outcome.errors.append(f"libcni's cache entry of {t.container_id} names a dead address and cannot be rewritten; "
                              "its reservations are kept")
        outcome.failed.add(t.key)
        return False
    for name in changed:
        log.info("libcni's cached result no longer names the dead addresses", entry=name, addresses=sorted(t.dead_ips))
    return True


def _verify_dir(t: Target, ip: str, dirs: dict[tuple[str, str], NetworkDir], outcome: Outcome) -> None:
    """A dead address's reservation directory must be seen as it was recorded: one that is missing in this view
    (but for a boot since: tmpfs) or is another directory leaves the record kept, unverified."""
    e = t.expect.get(ip)
    if e is None or e.dev is None or e.rebooted:
        return
    d = dirs.get((e.data_dir, t.network))
    if d is None or d.ident is None:
        import os

        if os.path.isdir(e.data_dir):
            return  # host-local makes the network's directory again when it needs it: nothing is reserved
        why = f"{e.data_dir} is not visible here"
    elif d.ident[0] == e.dev:
        return
    else:
        why = f"{e.data_dir}/{t.network} here is on another file system than when recorded"
    outcome.unverified.add(t.key)
    outcome.skipped.append(f"{t.network} {t.container_id} {ip}: reservation not verified gone ({why})")
