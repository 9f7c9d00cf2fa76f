"""The sweep every verb runs, split so that the common case costs next to nothing: reading the records
(json only) and one stat per record (plus one per tombstone) decide whether anything is stale; only then is
the clean-up machinery (planning, netfilter backends) imported and run.
"""

from __future__ import annotations

import os
import time

from . import log, netns
from .record import iso_to_epoch, key, nsid

TOMBSTONE_GRACE_SECONDS = 60.0
LIVE, DEAD = "live", "dead"
DONE, EXPIRED, WAIT = "tombstone-done", "tombstone-expired", "tombstone-wait"
SWEEPABLE = (DEAD, DONE, EXPIRED)


def cache_entry_exists(cache_dir: str, record: dict) -> bool:
    """libcni caches each attachment until its DEL succeeded: `<cacheDir>/results/<N>-<X>-<ifname>`."""
    name = f"{record['network']}-{record['containerID']}-{record['ifname']}"
    return os.path.lexists(os.path.join(cache_dir, "results", name))


def classify(record: dict, cache_dir: str, now: float | None = None) -> str:
    """live | dead | tombstone-done | tombstone-expired | tombstone-wait."""
    cur = record["current"]
    if record["deleted"] is not None:
        if not cache_entry_exists(cache_dir, record):
            return DONE  # the DEL of the whole chain is over (host-local released the addresses then)
        age = (now or time.time()) - iso_to_epoch(record["deleted"]["at"])
        if age > TOMBSTONE_GRACE_SECONDS and not netns.is_alive(cur["netns"], nsid(cur)):
            return EXPIRED  # the DEL failed long ago and the namespace is gone: nobody else will tear it down
        return WAIT  # a DEL of this attachment may still be running: bridge needs its chain until it is over
    return LIVE if netns.is_alive(cur["netns"], nsid(cur)) else DEAD


def settled(record: dict, state: str) -> bool:
    """A tombstone whose DEL is over and needs no look at the tables (see record.tombstone)."""
    return state == DONE and not record["deleted"].get("verify", True)


def stale(records: list[dict], states: dict, exclude: frozenset) -> bool:
    return any(key(r) not in exclude and (states[key(r)] in SWEEPABLE or (states[key(r)] == LIVE and r["earlier"]))
               for r in records)


def sweep_quietly(store, conf, exclude: frozenset = frozenset(), extra: list | None = None):
    """Sweep for a verb whose own work is done: nothing it meets fails the verb. Returns the outcome, or
    None when nothing was stale."""
    try:
        records = list(store.records())
        states = {key(r): classify(r, conf.cniCacheDir) for r in records}
        done = [r for r in records if key(r) not in exclude and settled(r, states[key(r)])]
        for r in done:
            store.remove(*key(r))
        if done:
            gone = {id(d) for d in done}
            records = [r for r in records if id(r) not in gone]
            log.info("records of finished DELs dropped", count=len(done))
        if not extra and not stale(records, states, exclude):
            return None
        from .reconcile import sweep

        return sweep(store, conf, exclude=exclude, extra=extra, records=records, states=states)
    except Exception as exc:  # noqa: BLE001
        log.warn("sweep failed; will retry on a later call", error=f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}")
        return None
