"""The sweep: which records are stale, which targets they give, and when records settle. Every verb (ADD,
CHECK, DEL, STATUS, GC) and the CLI go through here; cleanup.py only removes a given set of targets.

Split so that the common case costs next to nothing: reading the records (json only) and one stat per record
(plus one per tombstone) decide whether anything is stale (`sweep_quietly`); only then is the clean-up
machinery (planning, netfilter backends) imported and run (`sweep`).
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Callable

    from cni_reaper.reap.cleanup import Outcome
    from cni_reaper.reap.targets import Target

from cni_reaper import jsonio, log
from cni_reaper.reap import netns
from cni_reaper.reap.states import DONE, LIVE, SWEEPABLE, WAIT, classify, classify_entry
from cni_reaper.state.record import ips, key


# -- targets: which lives of which attachments are to be cleaned -------------------------------------
def earlier_target(record: dict) -> Target:
    """The addresses of a record's earlier lives that its current life does not hold."""
    from cni_reaper.reap.targets import Target

    old = ips(*record["earlier"]) - ips(record["current"])
    return Target(*key(record), frozenset(old), whole=False)


def dead_target(record: dict, keep_masq_chain: bool = False, parts: Iterable[str] | None = None) -> Target:
    """Every life of a record, the attachment wholly dead."""
    from cni_reaper.reap.targets import PARTS, Target

    return Target(*key(record), frozenset(ips(record["current"], *record["earlier"])), whole=True,
                  keep_masq_chain=keep_masq_chain, parts=frozenset(parts) if parts is not None else PARTS)


def targets_for(record: dict, state: str) -> list[Target]:
    """What of a record's lives is to be cleaned, given its state."""
    if state == WAIT:
        return []
    if state == LIVE:
        return [earlier_target(record)] if record["earlier"] else []
    return [dead_target(record)]


# -- what cni-reaper never recorded: found by the plugins' own tags ---------------------------------
def tagged_in_tables(backend_name: str) -> dict[tuple[str, str], set[str]]:
    """(network, container ID) of every attachment tagged in the nat tables of both families and in the
    plugins' native nftables tables, with the source IPs of its masquerade rules."""
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.iptables.plan import tagged_networks
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend
    from cni_reaper.reap.netfilter.nftables.plan import tagged_natively
    from cni_reaper.reap.netfilter.select import select

    found: dict[tuple[str, str], set[str]] = {}
    for owner, addresses in tagged_natively(NftBackend().read()).items():
        found.setdefault(owner, set()).update(addresses)
    for family in (4, 6):
        try:
            backend = select(backend_name, family)
        except BackendError:
            if family == 4:
                raise
            continue  # no ip6tables: no IPv6 rules
        for owner, addresses in tagged_networks(backend.read(family)).items():
            found.setdefault(owner, set()).update(addresses)
    return found


def orphan_targets(conf, recorded: set[tuple[str, str]], still_used: Callable[[str, str], bool],
                   only_network: str | None = None) -> list[Target]:
    """Attachments with rules tagged for them that cni-reaper has no record of (leaks from before it was
    installed) and that `still_used(network, container ID)` does not claim. GC asks the runtime's valid list;
    the CLI asks libcni's cache whether a live netns is behind it. A table that cannot be read is logged."""
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.targets import Target

    try:
        found = tagged_in_tables(conf.backend)
    except BackendError as exc:
        log.warn("the tables could not be read; orphans not searched", error=str(exc))
        return []
    return [Target(network, cid, "", frozenset(addresses), whole=True, any_source=True)
            for (network, cid), addresses in sorted(found.items())
            if (not only_network or network == only_network) and (network, cid) not in recorded
            and not still_used(network, cid)]


def cache_entry_alive(cache_dir: str, network: str, container_id: str) -> bool:
    """Whether libcni caches an attachment of (network, container ID) whose netns is a live namespace. An
    entry that cannot be read counts as alive: when in doubt, leave it."""
    results = os.path.join(cache_dir, "results")
    try:
        names = [n for n in os.listdir(results) if n.startswith(f"{network}-{container_id}-")]
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(results, name), "rb") as f:
                data = jsonio.loads(f.read(1 << 20))
            result = data.get("result") or {}
            if isinstance(result, str):
                result = jsonio.loads(result)
            sandboxes = [i.get("sandbox") for i in result.get("interfaces", []) if isinstance(i, dict) and i.get("sandbox")]
        except (OSError, ValueError, AttributeError):
            return True
        if not sandboxes or any(netns.identity(s) is not None for s in sandboxes):
            return True
    return False


# -- the sweep ---------------------------------------------------------------------------------------
def sweep(store, conf, records: list[dict] | None = None, states: dict | None = None,
          exclude: frozenset = frozenset(), extra: Iterable[Target] = (), only_network: str | None = None,
          dry_run: bool = False, backend_for=None) -> Outcome:
    """Clean every dead record, every ready tombstone and every earlier incarnation, and the `extra` targets;
    then drop the records that were cleaned and trim the earlier lives that were. The caller holds the state
    lock. Without `records`, the store's index says which records are stale, and only those are read; with
    them (GC, the CLI), those are the records. `states` (key -> state) may say a record is dead whatever its
    netns (GC's invalid attachments). Records in `exclude` are neither cleaned nor dropped, and their
    addresses stay protected; `store` None means there are no records (only `extra`)."""
    from cni_reaper.reap.cleanup import Outcome, clean

    states = dict(states or {})
    if records is None:
        entries = store.index() if store is not None else {}
        for e in entries.values():
            states.setdefault((e[1], e[2], e[3]), classify_entry(e, conf.cniCacheDir))
        live = {(e[1], e[2], e[3]): set(e[10]) for e in entries.values()
                if states[(e[1], e[2], e[3])] == LIVE or (e[1], e[2], e[3]) in exclude}
        wanted = [name for name, e in entries.items()
                  if (e[1], e[2], e[3]) not in exclude and (not only_network or e[1] == only_network)
                  and (states[(e[1], e[2], e[3])] in SWEEPABLE or (states[(e[1], e[2], e[3])] == LIVE and e[9]))]
        mine = [r for r in (store.load_named(name) for name in wanted) if r is not None]
    else:
        for r in records:
            states.setdefault(key(r), classify(r, conf.cniCacheDir))
        live = {key(r): ips(r["current"]) for r in records if states[key(r)] == LIVE or key(r) in exclude}
        mine = [r for r in records if key(r) not in exclude and (not only_network or r["network"] == only_network)]
    extra = list(extra)
    targets: list[Target] = list(extra)
    for r in mine:
        targets += targets_for(r, states[key(r)])
    if not targets:
        return Outcome()
    finished = frozenset(k for k, state in states.items() if state == DONE)
    started = time.monotonic()
    outcome = clean(targets, live, conf, backend_for=backend_for, tombstoned_keys=finished, dry_run=dry_run)
    if dry_run or store is None:
        return outcome
    cleaned: dict[str, int] = {}
    for r in mine:
        if key(r) in outcome.failed:
            continue
        state = states[key(r)]
        if state in SWEEPABLE:
            store.remove(*key(r), sync=False)
            log.info("record dropped", network=r["network"], containerID=r["containerID"], ifname=r["ifname"],
                     state=state)
            if state != DONE or key(r) in outcome.removed:  # a DEL that went well is no dead attachment
                cleaned[r["network"]] = cleaned.get(r["network"], 0) + 1
        elif state == LIVE and r["earlier"]:
            r["earlier"] = []
            store.save(r)
    for t in extra:  # attachments with no record (orphans, GC's): cleaned if something of theirs was
        if t.whole and t.key in outcome.removed and t.key not in outcome.failed:
            cleaned[t.network] = cleaned.get(t.network, 0) + 1
    store.sync()
    from cni_reaper.tools import metrics

    metrics.add(store, outcome, cleaned, time.monotonic() - started)
    return outcome


def sweep_quietly(store, conf, exclude: frozenset = frozenset(), extra: list | None = None) -> Outcome | None:
    """The sweep of a verb whose own work is done: nothing it meets fails the verb. With nothing stale it
    costs the state directory's index (store.index(): one small file, one scan) and a stat or two per
    record, and imports nothing more. Returns the outcome, or None when nothing was stale."""
    try:
        entries = store.index()
        stale_found = False
        done = []
        states: dict = {}
        for entry in list(entries.values()):
            k = (entry[1], entry[2], entry[3])
            state = states[k] = classify_entry(entry, conf.cniCacheDir)
            if k in exclude:
                continue
            if state == DONE and not entry[8]:  # a finished DEL that needs no look at the tables
                done.append(k)
            elif state in SWEEPABLE or (state == LIVE and entry[9]):
                stale_found = True
        for k in done:
            store.remove(*k, sync=False)
        if done:
            store.sync()
            log.info("records of finished DELs dropped", count=len(done))
        if not extra and not stale_found:
            return None
        return sweep(store, conf, states=states, exclude=exclude, extra=extra or ())
    except Exception as exc:  # noqa: BLE001 - a sweep never fails the verb that runs it
        log.warn("sweep failed; will retry on a later call", error=f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        return None
