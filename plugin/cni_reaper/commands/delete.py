"""DEL: cni-reaper runs first in a DEL (reverse conflist order). It removes at once what the downstream
plugins will not, marks the record torn down (a tombstone), and sweeps other dead attachments.
Best effort: DEL never fails because of cni-reaper's own state or clean-up."""

from __future__ import annotations

from .. import log, netns
from ..attachment import now
from ..errors import CniError
from ..models import Tombstone
from ..plan import Target
from ..reconcile import _ips, _nsid, safe_sweep
from ..store import Store


def immediate_targets(record, inv, conf) -> list[Target]:
    """What of this attachment must go now, before the downstream plugins' DEL runs.

    - The recorded life is this DEL's netns and it is alive: bridge, firewall and portmap tear it down,
      except portmap when DEL carries no port mappings and firewall when DEL carries no prevResult.
    - Otherwise (netns gone, CNI_NETNS empty, or another netns than the recorded one): bridge will skip its
      masquerade teardown, so everything of the recorded lives goes; but while CNI_NETNS is a live namespace
      the masquerade chain itself stays (bridge's DEL would fail on a missing chain; measured on 1.1.1).
    """
    cur = record.current
    key = (record.network, record.containerID, record.ifname)
    given_alive = netns.identity(inv.netns) is not None
    same_life = given_alive and inv.netns == cur.netns and netns.is_alive(cur.netns, _nsid(cur))
    targets = []
    if same_life:
        parts = set()
        if not conf.runtimeConfig.portMappings:
            parts.add("dnat")
        if conf.prevResult is None:
            parts.add("forward")
        if parts:
            targets.append(Target(*key, dead_ips=frozenset(_ips([cur])), whole=True, keep_masq_chain=True,
                                  parts=frozenset(parts), reason="DEL without ports or prevResult"))
        old = _ips(record.earlier) - _ips([cur])
        if record.earlier:
            targets.append(Target(*key, dead_ips=frozenset(old), whole=False, reason="earlier incarnation"))
    else:
        targets.append(Target(*key, dead_ips=frozenset(_ips([cur, *record.earlier])), whole=True,
                              keep_masq_chain=given_alive, reason="DEL of a dead attachment"))
    return targets


def run(inv):
    conf = inv.conf
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
                if record.deleted is None:
                    record.deleted = Tombstone(
                        at=now(),
                        netnsGone=netns.identity(inv.netns) is None,
                        hadPrevResult=conf.prevResult is not None,
                        hadPortMappings=bool(conf.runtimeConfig.portMappings),
                    )
                store.save(record)
            exclude = frozenset({record.key}) if record is not None else frozenset()
            safe_sweep(store, conf, exclude=exclude, extra=extra)
    except CniError as err:
        # The record stays as it was; its netns will be gone, so a later sweep still finds it dead.
        log.warn("DEL could not use the state directory; continuing", error=err.msg, details=err.details)
    finally:
        store.close()
    return None
