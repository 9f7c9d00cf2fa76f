"""The states of a record, and how one is classified: a leaf module (a stat or two per record, nothing else).

live: its netns path still holds the namespace recorded at ADD. dead: it does not (gone, unmounted, or
another namespace at the same path). A record whose DEL ran is a tombstone: done once libcni has dropped its
cache entry (the whole chain's DEL succeeded), expired when that never happened and the netns has been gone
for a grace period (a DEL that failed), waiting otherwise (a DEL may be in flight; bridge still needs its
chain).
"""

from __future__ import annotations

import os
import time

from . import netns
from .record import iso_to_epoch, nsid

TOMBSTONE_GRACE_SECONDS = 60.0
LIVE, DEAD = "live", "dead"
DONE, EXPIRED, WAIT = "tombstone-done", "tombstone-expired", "tombstone-wait"
SWEEPABLE = (DEAD, DONE, EXPIRED)  # what a sweep cleans and then drops


def cache_entry_exists(cache_dir: str, record: dict) -> bool:
    """libcni caches each attachment until its DEL succeeded: `<cacheDir>/results/<N>-<X>-<ifname>`."""
    name = f"{record['network']}-{record['containerID']}-{record['ifname']}"
    return os.path.lexists(os.path.join(cache_dir, "results", name))


def classify(record: dict, cache_dir: str, now: float | None = None) -> str:
    cur = record["current"]
    if record["deleted"] is not None:
        if not cache_entry_exists(cache_dir, record):
            return DONE  # the DEL of the whole chain is over (host-local released the addresses then)
        age = (now or time.time()) - iso_to_epoch(record["deleted"]["at"])
        if age > TOMBSTONE_GRACE_SECONDS and not netns.is_alive(cur["netns"], nsid(cur)):
            return EXPIRED  # the DEL failed long ago and the namespace is gone: nobody else will tear it down
        return WAIT
    return LIVE if netns.is_alive(cur["netns"], nsid(cur)) else DEAD


def settled(record: dict, state: str) -> bool:
    """A tombstone whose DEL is over and needs no look at the tables (see record.tombstone)."""
    return state == DONE and not record["deleted"].get("verify", True)
