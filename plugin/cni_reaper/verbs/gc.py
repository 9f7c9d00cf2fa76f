"""GC (CNI 1.1): every attachment of this network that is not in cni.dev/valid-attachments is dead: its
record, and also rules tagged for this network whose container ID is not valid (leaks from before
cni-reaper was installed), and host-local reservations of invalid attachments. One sweep does it all, other
networks' dead attachments included, as on every verb."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.cni.shell import Invocation

from cni_reaper import log
from cni_reaper.errors import INVALID_CONFIG, CniError
from cni_reaper.gojson import lookup, pick
from cni_reaper.reap.engine import gc_pass
from cni_reaper.state.store import Store

VALID_KEY = "cni.dev/valid-attachments"
OLD_KEY = "cni.dev/attachments"  # the name in an earlier text of the spec; libcni sends both


def valid_attachments(raw: dict[str, Any]) -> set[tuple[str, str]]:
    """The (containerID, ifname) pairs the runtime still uses; ifname "" stands for any of that container's.

    Decoded as Go decodes types.NetConf's field: any key case; `null`, or no key at all (what Go marshals for
    an empty list with omitempty), is the empty list: every attachment of the network is invalid. An entry
    that cannot be read refuses the GC (nothing is removed): skipping it could remove what it protects."""
    found, entries = lookup(raw, VALID_KEY)
    if not found or entries is None:
        entries = lookup(raw, OLD_KEY)[1]
    if entries is None:
        log.info(f"GC without {VALID_KEY}: no attachment of this network is valid")
        return set()
    if not isinstance(entries, list):
        raise CniError(INVALID_CONFIG, f"GC needs {VALID_KEY} as a list",
                       "the runtime must list the attachments that are still in use (an empty list is allowed)")
    out = set()
    for i, entry in enumerate(entries):
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise CniError(INVALID_CONFIG, f"{VALID_KEY}[{i}] must be an object with containerID and ifname")
        v = pick(entry, ("containerID", "ifname"))
        cid, ifn = v.get("containerID", ""), v.get("ifname", "")
        if not isinstance(cid, str) or not isinstance(ifn, str):
            raise CniError(INVALID_CONFIG, f"{VALID_KEY}[{i}]: containerID and ifname must be strings")
        if cid:
            out.add((cid, ifn))
    return out


def run(inv: Invocation) -> None:
    conf = inv.conf
    valid = valid_attachments(inv.raw)
    with Store.session(conf.stateDir, conf.lockTimeout) as store:
        gc_pass(store, conf, valid)
    return None
