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

    from cni_reaper.reap.cache import Cached
    from cni_reaper.reap.netfilter.domain import Domain, Plan
    from cni_reaper.state.journal import Journal
    from cni_reaper.values import Key

from cni_reaper import log
from cni_reaper.reap.claims import Claims
from cni_reaper.reap.hostlocal import NetworkDir, Reservation, locked_dirs, networks_in
from cni_reaper.reap.outcome import Outcome
from cni_reaper.reap.targets import NETFILTER_PARTS, Target

APPLY_ATTEMPTS = 3


class CleanupOptions:
    """What a clean-up needs to know beyond its targets: every data dir where reservations may be (for the
    claims), the lock timeout (what host-local's locks are held for: files.holding), how long each of them is
    waited for (`lock_wait`; None: the lock timeout), and the test hook for backends."""

    def __init__(self, data_dirs: list[str], lock_timeout: float, backend_for: Any = None, dry_run: bool = False,
                 journal: Journal | None = None, verb: str = "", lock_wait: float | None = None) -> None:
        self.data_dirs = list(dict.fromkeys(data_dirs))
        self.lock_timeout, self.backend_for, self.dry_run = lock_timeout, backend_for, dry_run
        self.journal, self.verb, self.lock_wait = journal, verb, lock_wait

    def note(self, items: list[dict[str, Any]], dumped: list[str] | None = None) -> str | None:
        """Journal what is about to be removed, before it is (None: no journal, e.g. a dry run; `dumped`: the
        items as JSON, from journal.batches). OSError when it cannot be noted: then it may not be removed."""
        return self.journal.intent(self.verb, items, dumped) if self.journal is not None and items else None

    def noted(self, event: str | None, removed: list[int]) -> None:
        if self.journal is not None and event is not None:
            self.journal.done(event, removed)


def clean(targets: list[Target], holders: dict[Key, set[str]], options: CleanupOptions) -> Outcome:
    """Remove what `targets` left behind. Never raises: failures are logged and reported in the outcome (the
    caller keeps the record for a retry). `holders` maps the key of every attachment that is live, unknown or
    being deleted to the addresses it holds."""
    outcome = Outcome()
    if not targets:
        return outcome
    try:
        _clean_locked(targets, holders, options, outcome)
    except Exception as exc:  # noqa: BLE001 - the clean-up never breaks a verb
        outcome.errors.append(f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        outcome.failed |= {t.key for t in targets}
    if not options.dry_run:
        _log(outcome)
    return outcome


def _clean_locked(targets: list[Target], holders: dict[Key, set[str]], options: CleanupOptions,
                  outcome: Outcome) -> None:
    """The clean-up under host-local's locks of the targets' networks (in every data dir): the claims read,
    the targets narrowed, the rules removed, the conntrack entries cleared, the reservations released."""
    target_dirs = {(e.data_dir, t.network) for t in targets for e in t.expect.values()}
    target_dirs |= {(d, t.network) for t in targets for d in options.data_dirs}
    with locked_dirs(target_dirs, options.lock_timeout, options.lock_wait) as dirs:
        others = [NetworkDir(d, n) for d in options.data_dirs for n in networks_in(d) if (d, n) not in dirs]
        try:
            claims = Claims(targets, holders, [*dirs.values(), *others])
            narrowed, protected = _narrow(targets, claims, outcome)
            _clean_netfilter(narrowed, protected, options, outcome)
            _clear_conntrack(narrowed, protected, outcome, options)
            _release(narrowed, claims, dirs, outcome, options)
        finally:
            for d in others:
                d.close()


def _narrow(targets: list[Target], claims: Claims, outcome: Outcome) -> tuple[list[Target], dict]:
    """Each target cut to what is its alone (_narrow_one); `protected[key]`: its addresses whose untagged rules
    and conntrack entries must stay."""
    narrowed, protected = [], {}
    for t in targets:
        n, protected[t.key] = _narrow_one(t, claims, outcome)
        narrowed.append(n)
    return narrowed, protected


def _narrow_one(t: Target, claims: Claims, outcome: Outcome) -> tuple[Target, set[str]]:
    """A target cut to what is its alone: addresses no other life of its container holds (its tagged rules of
    them), its chains only when no other life of its container is there; and its addresses whose untagged
    rules and conntrack entries must stay. What it leaves goes into the outcome, with why: waiting for the
    runtime when the claims cannot see every holder, held when a reservation naming it is not its own."""
    doubt = claims.unreserved_doubt(t) if t.reserved_in else None
    if doubt is not None:  # not proven dead: nothing of it is touched
        outcome.spare(t.network, t.container_id, "", doubt)
        outcome.waiting[t.key] = doubt
        return t.replace(dead_ips=frozenset(), whole=False, any_source=False, parts=frozenset()), set()
    kin_free = frozenset(ip for ip in t.dead_ips if claims.kin_free(t, ip))
    whole = t.whole and claims.container_free(t)
    _say_spared(t, kin_free, whole, claims, outcome)
    return t.narrowed(kin_free, whole), {ip for ip in kin_free if not claims.ip_free(t, ip)}


def _say_spared(t: Target, kin_free: frozenset[str], whole: bool, claims: Claims, outcome: Outcome) -> None:
    """What of t the claims keep, and why, into the outcome: waiting for the runtime's DEL or GC when the claims
    cannot see every holder; held (its record stays) when a reservation naming it is not its own."""
    for ip in sorted(t.dead_ips - kin_free):
        outcome.spare(t.network, t.container_id, ip, claims.why_kept(t, ip))
    if t.whole and not whole:
        outcome.spare(t.network, t.container_id, "", claims.why_chains_kept(t))
    unseen = claims.unseen(t)
    if unseen is not None:
        outcome.waiting[t.key] = unseen
        return
    unexplained = claims.unexplained(t) if kin_free != t.dead_ips or whole != t.whole else None
    if unexplained is not None:  # the record stays, held (settle obeys the verdict)
        outcome.held.setdefault(t.key, unexplained)


def _log(outcome: Outcome) -> None:
    backend = outcome.backend
    log.each("info", "removed", [{"network": owner[0], "containerID": owner[1], "ifname": owner[2], "items": items,
                                  "backend": backend} for owner, items in outcome.removed.items()])
    for msg in outcome.skipped:
        log.info("left in place", why=msg)
    for err in outcome.errors:
        log.warn("clean-up failed; will retry on a later call", error=err)


# -- netfilter ------------------------------------------------------------------------------------
def _clean_netfilter(targets: list[Target], protected: dict, options: CleanupOptions, outcome: Outcome) -> None:
    from cni_reaper.reap.netfilter.domain import domains

    wanted = [t for t in targets if t.parts & NETFILTER_PARTS]
    if not wanted:
        return
    for domain in domains(wanted, protected, outcome.errors, outcome.failed, options.backend_for):
        if domain.label.startswith("ipv"):
            outcome.backends[int(domain.label[3:])] = domain.backend_name
        _clean_domain(domain, outcome, options)


def _owners(domain: Domain) -> dict[tuple[str, str], Key]:
    return {(t.network, t.container_id): t.key for t in domain.targets}


def _journaled(domain: Domain, snapshot: Any, ops: list[Any], options: CleanupOptions) -> str | None:
    """Journal the ops (each item with the key of the attachment it was left by), then apply them."""
    owners = _owners(domain)
    items = [dict(item, key=list(owners[op.owner])) for item, op in zip(domain.journal(snapshot, ops), ops)]
    event = options.note(items)
    domain.apply(ops)
    options.noted(event, list(range(len(items))))
    return event


def _clean_domain(domain: Domain, outcome: Outcome, options: CleanupOptions) -> None:
    """Read, plan, apply in one transaction; on failure (a concurrent writer changed the tables) read, plan and
    try again; then one operation at a time. A held xtables lock stops at once: a later call will retry.
    What is applied is journaled first (state/journal.py)."""
    from cni_reaper.reap.netfilter.interface import BackendError, LockHeld

    owners = _owners(domain)
    for _attempt in range(APPLY_ATTEMPTS):
        try:
            snapshot = domain.read()
            p = domain.plan(snapshot)
            if p.ops and not options.dry_run:
                _journaled(domain, snapshot, p.ops, options)
            for op in p.ops:
                outcome.note(owners[op.owner], f"{domain.label} {op.table} {op.chain}: {op.what}", domain.kinds[op.part])
            _skipped(domain, p, outcome)
            return
        except LockHeld as exc:
            outcome.errors.append(f"{domain.label}: {exc}")
            outcome.failed |= set(owners.values())
            return
        except OSError as exc:  # the journal cannot be written: nothing is removed
            outcome.errors.append(f"{domain.label}: the journal cannot be written ({exc.strerror}); nothing removed")
            outcome.failed |= set(owners.values())
            return
        except BackendError:
            continue
    _apply_one_by_one(domain, outcome, options)


def _apply_one_by_one(domain: Domain, outcome: Outcome, options: CleanupOptions) -> None:
    """The transaction kept failing: apply each operation alone so that one stubborn rule does not keep the
    rest. Whatever fails is logged and the owner's record is kept for a later retry."""
    from cni_reaper.reap.netfilter.interface import BackendError

    owners = _owners(domain)
    try:
        snapshot = domain.read()
        p = domain.plan(snapshot)
    except BackendError as exc:
        outcome.errors.append(f"{domain.label}: {exc}")
        outcome.failed |= set(owners.values())
        return
    for op in p.ops:
        owner = owners[op.owner]
        try:
            _journaled(domain, snapshot, [op], options)
            outcome.note(owner, f"{domain.label} {op.table} {op.chain}: {op.what}", domain.kinds[op.part])
        except (BackendError, OSError) as exc:
            outcome.errors.append(f"{domain.label} {op.table} {op.chain} ({op.what}): {exc}")
            outcome.failed.add(owner)
    _skipped(domain, p, outcome)


def _skipped(domain: Domain, p: Plan, outcome: Outcome) -> None:
    outcome.skipped += p.skipped
    owners = _owners(domain)
    for owner, why in p.held.items():
        outcome.held[owners[owner]] = f"{domain.label} {why}"


# -- conntrack and reservations ------------------------------------------------------------------------
def _clear_conntrack(targets: list[Target], protected: dict, outcome: Outcome, options: CleanupOptions) -> None:
    """Once a dead attachment's rules are gone: the conntrack entries whose reply source or original
    destination is one of its dead addresses, never for an address someone else holds (protected). They
    cannot be put back: the journal says they were cleared."""
    from cni_reaper.reap import conntrack

    owner_of = _conntrack_owners(targets, protected, outcome)
    if not owner_of:
        return
    journaled: list[str | None] = []

    def journal_first(counts: dict[str, int]) -> None:  # OSError: not noted, so nothing is cleared
        journaled.append(options.note(_conntrack_items(counts, owner_of)))

    try:
        counts = conntrack.count(set(owner_of)) if options.dry_run else conntrack.clear(set(owner_of), journal_first)
    except conntrack.ConntrackError as exc:
        if exc.errno not in conntrack.UNAVAILABLE:
            outcome.errors.append(f"conntrack: {exc}")  # the entries expire in time; the records are not kept
        return
    except OSError as exc:  # the journal could not say it: the entries stay, the records are kept for a retry
        outcome.errors.append(f"conntrack entries of {', '.join(sorted(owner_of))} kept: not journaled ({exc})")
        outcome.failed |= set(owner_of.values())
        return
    if journaled:
        try:
            options.noted(journaled[0], list(range(len(counts))))
        except OSError:
            pass  # cleared already: the intent says so, and the entries are counted below
    for ip, n in sorted(counts.items()):
        outcome.note(owner_of[ip], f"conntrack: {n} entr{'y' if n == 1 else 'ies'} of {ip}", "conntrack", n)


def _conntrack_items(counts: dict[str, int], owner_of: dict[str, Key]) -> list[dict[str, Any]]:
    return [{"kind": "conntrack", "key": list(owner_of[ip]), "ip": ip, "entries": n} for ip, n in sorted(counts.items())]


def _conntrack_owners(targets: list[Target], protected: dict, outcome: Outcome) -> dict[str, Key]:
    """The dead addresses whose conntrack entries may go (not protected, their target not failed), each with
    the first target that names it."""
    owner_of: dict[str, Key] = {}
    for t in targets:
        if "conntrack" in t.parts and t.key not in outcome.failed:
            for ip in sorted(t.dead_ips - protected.get(t.key, set())):
                owner_of.setdefault(ip, t.key)
    return owner_of


def _release(targets: list[Target], claims: Claims, dirs: dict[tuple[str, str], NetworkDir], outcome: Outcome,
             options: CleanupOptions) -> None:
    """Per dead address that no other life of its container holds: libcni's cached result of the attachment
    forgets it, then its own reservation (if there is one still) is removed. A later DEL of the dead
    attachment (the runtime's, or libcni 1.3's GC) would otherwise hand the address to the firewall plugin,
    which deletes the rules of whoever holds the address by then: the next allocation that got it, from
    cni-reaper's release or from a boot that emptied host-local's directory. The reservations are journaled
    together, before any goes (one fsync, not one per address)."""
    due: list[tuple[Target, Reservation]] = []
    eligible = [t for t in targets if "reservation" in t.parts and t.key not in outcome.failed and t.dead_ips]
    if not options.dry_run:
        _forget(eligible, outcome, options)
    for t in eligible:
        if t.key not in outcome.failed:
            due += _releasable(t, claims, dirs, outcome, options.dry_run)
    released = list(range(len(due))) if options.dry_run else _release_all(due, dirs, options, outcome)
    for i in released:
        t, r = due[i]
        outcome.note(t.key, f"host-local reservation {r.network}/{r.ip}", "reservation")


def _releasable(t: Target, claims: Claims, dirs: dict[tuple[str, str], NetworkDir], outcome: Outcome,
                dry_run: bool) -> list[tuple[Target, Reservation]]:
    """t's own reservations of its dead addresses, in a directory locked here (any, in a dry run); a directory
    not seen as it was recorded keeps the record (_verify_dir)."""
    due = []
    for ip in sorted(t.dead_ips):
        _verify_dir(t, ip, dirs, outcome)
        due += [(t, r) for r in claims.releasable(t, ip) if dry_run or (r.data_dir, r.network) in dirs]
    return due


def _release_all(due: list[tuple[Target, Reservation]], dirs: dict[tuple[str, str], NetworkDir], options: CleanupOptions,
                 outcome: Outcome) -> list[int]:
    """Remove the reservations `due`, journaled first, a batch at a time; the indexes of those removed. (One
    after the other: each is a read, a comparison and an unlink, mostly Python; two threads took as long
    here and cost more CPU time, unlike the records' bare unlinks, state/pool.py.)"""
    from cni_reaper.state.journal import batches

    items = [{"kind": "reservation", "key": list(t.key), "dataDir": r.data_dir, "network": r.network, "ip": r.ip,
              "content": r.content, "mode": r.mode, "mtime": r.ident[1]} for t, r in due]
    released: list[int] = []
    for start, end, dumped in batches(items):
        try:
            event = options.note(items[start:end], dumped)
        except OSError as exc:
            for t, r in due[start:]:
                outcome.errors.append(f"the journal cannot be written ({exc.strerror}); reservation {r.ip} kept")
                outcome.failed.add(t.key)
            break
        done = [i for i in range(start, end) if dirs[(due[i][1].data_dir, due[i][1].network)].release(due[i][1])]
        options.noted(event, [i - start for i in done])
        released += done
    return released


def _forget(targets: list[Target], outcome: Outcome, options: CleanupOptions) -> None:
    """libcni's cached results of the targets forget their dead addresses, journaled first, a batch at a time;
    a target whose cached result names one and could not be rewritten keeps its reservations (failed)."""
    from cni_reaper.state.journal import batches

    failed: dict[Key, Target] = {}
    jobs = _cache_jobs(targets, failed)
    items = [{"kind": "cache", "key": list(t.key), "cacheDir": t.cache_dir, "entry": e.name, "content": e.text}
             for t, e in jobs]
    for start, end, dumped in batches(items):
        try:
            event = options.note(items[start:end], dumped)
        except OSError:
            failed.update({t.key: t for t, _ in jobs[start:]})
            break
        options.noted(event, _forget_batch(jobs[start:end], failed))
    for t in failed.values():
        outcome.errors.append(f"libcni's cache entry of {t.container_id} may name a dead address and cannot be read or "
                              "rewritten; its reservations are kept")
        outcome.failed.add(t.key)


def _forget_batch(batch: list[tuple[Target, Cached]], failed: dict[Key, Target]) -> list[int]:
    """One journaled batch of cached results made to forget their targets' dead addresses, one cache directory
    at a time; the indexes of those rewritten (a target whose entry could not be goes into `failed`)."""
    from cni_reaper.reap import cache

    done = []
    for cache_dir in dict.fromkeys(t.cache_dir for t, _ in batch):
        mine = [i for i, (t, _) in enumerate(batch) if t.cache_dir == cache_dir]
        for i, ok in zip(mine, cache.forget(cache_dir, [(batch[i][1], set(batch[i][0].dead_ips)) for i in mine])):
            t, e = batch[i]
            if ok:
                done.append(i)
                log.info("libcni's cached result no longer names the dead addresses", entry=e.name,
                         addresses=sorted(t.dead_ips))
            else:
                failed[t.key] = t
    return sorted(done)


def _cache_jobs(targets: list[Target], failed: dict[Key, Target]) -> list[tuple[Target, Cached]]:
    """Each cached result (cache.Cached) that names a target's dead address, with its target; a target whose
    own entry cannot be read goes into `failed`."""
    from cni_reaper.reap import cache

    listed: dict[str, cache.Results] = {}
    jobs: list[tuple[Target, cache.Cached]] = []
    for t in targets:
        if t.cache_dir:
            results = listed.get(t.cache_dir) or listed.setdefault(t.cache_dir, cache.Results(t.cache_dir))
            found = results.to_forget(t.network, t.container_id, t.ifname, set(t.dead_ips))
            if found is None:
                failed[t.key] = t
            else:
                jobs += [(t, e) for e in found]
    return jobs


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
    elif e.dev in (d.ident[0], d.file_dev):  # a reservation's recorded device is its file's (overlayfs: its layer's)
        return
    else:
        why = f"{e.data_dir}/{t.network} here is on another file system than when recorded"
    outcome.unverified.add(t.key)
    outcome.spare(t.network, t.container_id, ip, f"reservation not verified gone ({why})")
