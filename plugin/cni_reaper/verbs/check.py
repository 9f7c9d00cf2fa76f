"""CHECK: the record must describe this attachment. A missing or stale record is repaired, not failed:
Nomad destroys and recreates the allocation's network when CHECK fails."""

from __future__ import annotations

from cni_reaper import log
from cni_reaper.cni.result import recorded_ips
from cni_reaper.errors import INVALID_CONFIG, UNKNOWN_CONTAINER, CniError
from cni_reaper.reap.sweep import sweep_quietly
from cni_reaper.state.record import incarnation, merge, same_life
from cni_reaper.state.store import Store


def run(inv):
    conf = inv.conf
    if conf.prevResult is None:
        raise CniError(INVALID_CONFIG, "CHECK needs prevResult",
                       "cni-reaper must be chained after an interface-creating plugin")
    ips = recorded_ips(conf.prevResult, inv.version)
    current = incarnation(inv.netns, ips, [p.as_dict() for p in conf.portMappings])
    if current["netnsId"] is None:
        raise CniError(UNKNOWN_CONTAINER, f"{inv.netns} is not a network namespace",
                       "the container's network namespace is gone; the runtime should recreate the network")
    store = Store(conf.stateDir, conf.lockTimeout).open()
    try:
        with store.locked():
            existing = store.load(conf.name, inv.container_id, inv.ifname)
            if existing is not None and existing["deleted"] is None and same_life(existing["current"], current):
                sweep_quietly(store, conf)
                return None
            record, _ = merge(existing, conf.name, inv.container_id, inv.ifname, current,
                              inv.args or (existing["cniArgs"] if existing else {}))
            store.save(record)
            if existing is None:
                log.info("CHECK adopted an attachment that had no record")
            else:
                log.warn("CHECK found a stale record and repaired it; the earlier life is kept for clean-up")
            sweep_quietly(store, conf)
    finally:
        store.close()
    return None
