"""DEL: mark the record torn down (a tombstone). Best effort: DEL never fails because of cni-reaper's state."""

from __future__ import annotations

from .. import log, netns
from ..attachment import now
from ..errors import CniError
from ..models import Tombstone
from ..store import Store


def run(inv):
    conf = inv.conf
    store = Store(conf.stateDir, conf.lockTimeout)
    try:
        store.open(create=False)
        with store.locked():
            record = store.load(conf.name, inv.container_id, inv.ifname)
            if record is None:
                log.info("no record for this attachment; nothing to mark")
            elif record.deleted is None:
                record.deleted = Tombstone(
                    at=now(),
                    netnsGone=netns.identity(inv.netns) is None,
                    hadPrevResult=conf.prevResult is not None,
                    hadPortMappings=bool(conf.runtimeConfig.portMappings),
                )
                store.save(record)
    except CniError as err:
        # The record stays as it was; its netns will be gone, so a later sweep still finds it dead.
        log.warn("DEL could not update the record; continuing", error=err.msg, details=err.details)
    finally:
        store.close()
    return None
