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

from cni_reaper.reap import netns
from cni_reaper.state.record import iso_to_epoch, nsid

TOMBSTONE_GRACE_SECONDS = 60.0
LIVE, DEAD = "live", "dead"
DONE, EXPIRED, WAIT = "tombstone-done", "tombstone-expired", "tombstone-wait"
SWEEPABLE = (DEAD, DONE, EXPIRED)  # what a sweep cleans and then drops


def cache_entry_exists(cache_dir: str, network: str, container_id: str, ifname: str) -> bool:
    """libcni caches each attachment until its DEL succeeded: `<cacheDir>/results/<N>-<X>-<ifname>`."""
    return os.path.lexists(os.path.join(cache_dir, "results", f"{network}-{container_id}-{ifname}"))


def state_of(network: str, container_id: str, ifname: str, netns_path: str, ns: tuple[int, int] | None,
             deleted_at: float | None, cache_dir: str, now: float | None = None) -> str:
    """The state, from what a record (or its index entry) says of the attachment."""
    if deleted_at is not None:
        if not cache_entry_exists(cache_dir, network, container_id, ifname):
            return DONE  # the DEL of the whole chain is over (host-local released the addresses then)
        age = (now or time.time()) - deleted_at
        if age > TOMBSTONE_GRACE_SECONDS and not netns.is_alive(netns_path, ns):
            return EXPIRED  # the DEL failed long ago and the namespace is gone: nobody else will tear it down
        return WAIT
    return LIVE if netns.is_alive(netns_path, ns) else DEAD


def classify(record: dict, cache_dir: str, now: float | None = None) -> str:
    cur, dead = record["current"], record["deleted"]
    return state_of(record["network"], record["containerID"], record["ifname"], cur["netns"], nsid(cur),
                    iso_to_epoch(dead["at"]) if dead is not None else None, cache_dir, now)


def classify_entry(entry: list, cache_dir: str, now: float | None = None) -> str:
    """The state from an index entry (store.index_entry), without reading the record. The common case, a
    record that is no tombstone, is one stat (a sweep with 1,000 live records makes 1,000 of these)."""
    if entry[7] is None:
        try:
            st = os.stat(entry[4])
        except (OSError, ValueError, TypeError):
            return DEAD
        if st.st_dev != netns.nsfs_dev() or (entry[5] is not None and (st.st_dev, st.st_ino) != (entry[5], entry[6])):
            return DEAD
        return LIVE
    _ino, network, cid, ifname, path, dev, ino, deleted_at = entry[:8]
    return state_of(network, cid, ifname, path, (dev, ino) if dev is not None else None, deleted_at, cache_dir, now)
