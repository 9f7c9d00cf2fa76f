"""DEL: cni-reaper runs first in a DEL (reverse conflist order). It removes at once what the downstream
plugins will not, marks the record torn down (a tombstone), and sweeps other dead attachments.
Best effort: DEL never fails because of cni-reaper's own state or clean-up."""

from __future__ import annotations

from cni_reaper import log
from cni_reaper.errors import CniError
from cni_reaper.reap import netns
from cni_reaper.reap.sweep import dead_target, earlier_target, sweep_quietly
from cni_reaper.state.record import key, nsid, tombstone
from cni_reaper.state.store import Store


def immediate_targets(record: dict, inv, conf) -> list:
    """What of this attachment must go now, before the downstream plugins' DEL runs.

    - The recorded life is this DEL's netns and it is alive: bridge, firewall and portmap tear it down,
      except portmap when DEL carries no port mappings and firewall when DEL carries no prevResult.
    - Otherwise (netns gone, CNI_NETNS empty, or another netns than the recorded one): bridge will skip its
      masquerade teardown, so everything of the recorded lives goes; but while CNI_NETNS is a live namespace
      the masquerade chain itself stays (bridge's DEL would fail on a missing chain; measured on 1.1.1).
    """
    cur = record["current"]
    given_alive = netns.identity(inv.netns) is not None
    same_life = given_alive and inv.netns == cur["netns"] and netns.is_alive(cur["netns"], nsid(cur))
    parts = set()
    if same_life:
        if not conf.portMappings:
            parts.add("dnat")
        if conf.prevResult is None:
            parts.add("forward")
    if same_life and not parts and not record["earlier"]:
        return []  # the common case: the downstream plugins remove everything; nothing to import
    if not same_life:
        return [dead_target(record, keep_masq_chain=given_alive)]
    targets = []
    if parts:
        targets.append(dead_target(record, keep_masq_chain=True, parts=parts))
    if record["earlier"]:
        targets.append(earlier_target(record))
    return targets


def run(inv):
    conf = inv.conf
    if conf.stateDir is None:
        log.warn("DEL has no usable state directory; nothing of this attachment can be looked up")
        return None
    store = Store(conf.stateDir, conf.lockTimeout)
    try:
        store.open(create=False)
        with store.locked():
            record = store.load(conf.name, inv.container_id, inv.ifname)
            extra = []
            if record is None:
                log.info("no record for this attachment; nothing of it to remove")
            else:
                extra = immediate_targets(record, inv, conf)
                if record["deleted"] is None:
                    record["deleted"] = tombstone(netns.identity(inv.netns) is None, conf.prevResult is not None,
                                                  bool(conf.portMappings), verify=bool(extra))
                store.save(record)
            exclude = frozenset({key(record)}) if record is not None else frozenset()
            sweep_quietly(store, conf, exclude=exclude, extra=extra)
    except CniError as err:
        # The record stays as it was; its netns will be gone, so a later sweep still finds it dead.
        log.warn("DEL could not use the state directory; continuing", error=err.msg, details=err.details)
    finally:
        store.close()
    return None
