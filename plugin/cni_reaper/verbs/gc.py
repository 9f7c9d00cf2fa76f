"""GC (CNI 1.1): every attachment of this network that is not in cni.dev/valid-attachments is dead: its
record, and also rules tagged for this network whose container ID is not valid (leaks from before
cni-reaper was installed), and host-local reservations of invalid attachments. One sweep does it all, other
networks' dead attachments included, as on every verb."""

from __future__ import annotations

from cni_reaper import log
from cni_reaper.errors import INVALID_CONFIG, CniError
from cni_reaper.gojson import lookup, pick
from cni_reaper.reap.states import DEAD, LIVE, classify
from cni_reaper.reap.sweep import orphan_targets, sweep
from cni_reaper.state.record import key
from cni_reaper.state.store import Store

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


def reservation_targets(conf, still_used) -> list:
    """Reservations of this network whose holder `still_used(containerID, ifname)` does not claim."""
    from cni_reaper.reap.hostlocal import NetworkDir
    from cni_reaper.reap.targets import Target

    d = NetworkDir(conf.ipamDataDir, conf.name)
    try:
        held = sorted(d.reservations().items())
    finally:
        d.close()
    return [Target(conf.name, cid, ifname, frozenset({ip}), whole=True, parts=frozenset({"reservation", "conntrack"}))
            for ip, (cid, ifname) in held if not still_used(cid, ifname)]


def run(inv):
    conf = inv.conf
    valid = valid_attachments(inv.raw)
    store = Store(conf.stateDir, conf.lockTimeout).open()
    try:
        with store.locked():
            records = list(store.records())
            states = {key(r): classify(r, conf.cniCacheDir) for r in records}
            mine = [r for r in records if r["network"] == conf.name]
            for r in mine:
                if not holds(valid, r["containerID"], r["ifname"]):
                    states[key(r)] = DEAD  # the runtime says so, whatever its netns
            live = {(r["containerID"], r["ifname"]) for r in mine if states[key(r)] == LIVE}
            extra = orphan_targets(conf, {(conf.name, r["containerID"]) for r in mine},
                                   lambda network, cid: holds(valid, cid, ""), only_network=conf.name)
            extra += reservation_targets(conf, lambda cid, ifname: holds(valid, cid, ifname) or holds(live, cid, ifname))
            sweep(store, conf, records=records, states=states, extra=extra)
    finally:
        store.close()
    return None
