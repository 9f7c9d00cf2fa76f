"""GC (CNI 1.1): every attachment of this network that is not in cni.dev/valid-attachments is dead: its
record, and also rules tagged for this network whose container ID is not valid (leaks from before
cni-reaper was installed), and host-local reservations of invalid attachments."""

from __future__ import annotations

from .. import log
from ..gojson import lookup, pick
from ..errors import INVALID_CONFIG, CniError
from ..hostlocal import locked_networks
from ..plan import Target
from ..reconcile import clean, targets_for
from ..record import key
from ..store import Store
from ..sweep import LIVE, classify, sweep_quietly

VALID_KEY = "cni.dev/valid-attachments"
OLD_KEY = "cni.dev/attachments"  # the name in an earlier text of the spec; libcni sends both


def valid_attachments(raw: dict) -> set[tuple[str, str]]:
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


def holds(pairs: set[tuple[str, str]], cid: str, ifname: str) -> bool:
    """Whether (cid, ifname) is among `pairs`; an empty ifname on either side matches any ifname."""
    return (cid, ifname) in pairs or (cid, "") in pairs or (not ifname and any(c == cid for c, _ in pairs))


def orphan_targets(conf, valid_ids: set[str], recorded_ids: set[str]) -> list[Target]:
    """Containers with rules tagged for this network, neither valid nor recorded."""
    from ..netfilter.backend import BackendError
    from ..reconcile import tagged_in_tables

    found: dict[str, set[str]] = {}
    try:
        found = {cid: ips for (net, cid), ips in tagged_in_tables(conf.backend).items() if net == conf.name}
    except BackendError as exc:
        log.warn("GC could not read the tables; orphans not searched", error=str(exc))
    return [Target(conf.name, cid, "", frozenset(ips), whole=True, any_source=True,
                   parts=frozenset({"masq", "dnat", "forward"}), reason="GC orphan")
            for cid, ips in sorted(found.items()) if cid not in valid_ids and cid not in recorded_ids]


def release_invalid_reservations(conf, valid: set[tuple[str, str]], live_keys: set[tuple[str, str]]) -> int:
    released = 0
    with locked_networks(conf.ipamDataDir, [conf.name], conf.lockTimeout) as dirs:
        d = dirs[conf.name]
        for ip, (cid, ifname) in sorted(d.reservations().items()):
            if holds(valid, cid, ifname) or holds(live_keys, cid, ifname):
                continue
            if d.release(ip, cid, ifname):
                released += 1
                log.info("removed", network=conf.name, containerID=cid, items=[f"host-local reservation {conf.name}/{ip}"])
    return released


def run(inv):
    conf = inv.conf
    valid = valid_attachments(inv.raw)
    valid_ids = {cid for cid, _ in valid}
    store = Store(conf.stateDir, conf.lockTimeout).open()
    try:
        with store.locked():
            records = list(store.records())
            mine = [r for r in records if r["network"] == conf.name]
            invalid = [r for r in mine if not holds(valid, r["containerID"], r["ifname"])]
            invalid_keys = {key(r) for r in invalid}
            targets = [t for r in invalid for t in targets_for(r, "dead")]
            live_others = [r for r in records
                           if key(r) not in invalid_keys and classify(r, conf.cniCacheDir) == LIVE]
            targets += orphan_targets(conf, valid_ids, {r["containerID"] for r in mine})
            outcome = clean(targets, live_others, conf)
            for r in invalid:
                if key(r) not in outcome.failed:
                    store.remove(*key(r))
            live_keys = {(r["containerID"], r["ifname"]) for r in live_others if r["network"] == conf.name}
            release_invalid_reservations(conf, valid, live_keys)
            # other networks' dead attachments too, as on every verb
            sweep_quietly(store, conf, exclude=frozenset(key(r) for r in mine))
    finally:
        store.close()
    return None
