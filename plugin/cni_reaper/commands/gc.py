"""GC (CNI 1.1): every recorded attachment of this network that is not in cni.dev/valid-attachments is dead."""

from __future__ import annotations

from .. import log, names
from ..attachment import now
from ..errors import INVALID_CONFIG, CniError
from ..models import Tombstone
from ..store import Store

VALID_KEY = "cni.dev/valid-attachments"


def valid_attachments(raw: dict) -> set[tuple[str, str]]:
    """The (containerID, ifname) pairs the runtime still uses. Refuses a missing or malformed list:
    treating it as empty would declare every attachment of the network dead."""
    entries = raw.get(VALID_KEY)
    if not isinstance(entries, list):
        raise CniError(INVALID_CONFIG, f"GC needs {VALID_KEY} as a list",
                       "the runtime must list the attachments that are still in use (an empty list is allowed)")
    out = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise CniError(INVALID_CONFIG, f"{VALID_KEY}[{i}] must be an object with containerID and ifname")
        try:
            cid = names.container_id(entry.get("containerID") if isinstance(entry.get("containerID"), str) else None)
            ifn = names.ifname(entry.get("ifname") if isinstance(entry.get("ifname"), str) else None)
        except CniError as err:
            raise CniError(INVALID_CONFIG, f"{VALID_KEY}[{i}]: {err.msg}", err.details) from None
        out.add((cid, ifn))
    return out


def run(inv):
    conf = inv.conf
    valid = valid_attachments(inv.raw)
    store = Store(conf.stateDir, conf.lockTimeout).open()
    marked = 0
    try:
        with store.locked():
            for record in store.records():
                if record.network != conf.name or record.deleted is not None:
                    continue
                if (record.containerID, record.ifname) in valid:
                    continue
                record.deleted = Tombstone(at=now(), netnsGone=False, hadPrevResult=False, hadPortMappings=False)
                store.save(record)
                marked += 1
    finally:
        store.close()
    if marked:
        log.info("GC marked attachments that are no longer valid", count=marked)
    return None
