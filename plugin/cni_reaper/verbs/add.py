"""ADD: record the attachment, pass prevResult through unchanged, sweep what dead attachments left."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.cni.shell import Invocation
    from cni_reaper.state.record import Life

from cni_reaper import log
from cni_reaper.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError
from cni_reaper.gojson import lookup
from cni_reaper.state.record import RecordSettings, merge
from cni_reaper.state.store import BRIEF_WAIT, Store
from cni_reaper.verbs.recording import current_life, host_ports


def run(inv: Invocation) -> dict[str, Any]:
    conf = inv.conf
    if conf.prevResult is None:
        raise CniError(
            INVALID_CONFIG,
            "cni-reaper must be chained after an interface-creating plugin",
            "put it last in a conflist's plugins list, after bridge/firewall/portmap; it got no prevResult",
        )
    if not conf.portMappingsDeclared:
        log.warn("cni-reaper's conflist entry does not declare the portMappings capability, so the runtime "
                 "hands it no port mappings: none recorded (dead attachments' DNAT rules are still found by "
                 "their owner tag)", fix='add "capabilities": {"portMappings": true} to cni-reaper\'s entry')
    current = current_life(inv)
    cached_unrecorded = False
    try:
        cached_unrecorded = _record(inv, current, BRIEF_WAIT)
    except CniError as err:
        if err.code != TRY_AGAIN_LATER or conf.lockTimeout <= BRIEF_WAIT:
            _unrecorded(inv, err)
        else:  # another process holds the state lock: the allocation does not wait for it
            log.info("the state lock is held by another process: this attachment is recorded after the answer",
                     waited=BRIEF_WAIT)
            from cni_reaper.cni.afterwards import later

            later(lambda: _record_after_the_answer(inv, current), conf.stateDir)
            return _answer(inv)
    except Exception as err:  # noqa: BLE001 - its own bookkeeping never fails an ADD (OSError, a damaged file)
        _unrecorded(inv, err)
    if conf.portMappings:
        _look(inv, current, cached_unrecorded)
    return _answer(inv)


def _answer(inv: Invocation) -> dict[str, Any]:
    """The chain's result, passed through (with the call's CNI version when it names none)."""
    result = dict(inv.conf.prevResult)
    if not lookup(result, "cniVersion")[0]:
        result["cniVersion"] = inv.version
    return result


def _unrecorded(inv: Invocation, err: Exception) -> None:
    """Its own bookkeeping never fails an ADD the chain accepted (a full disk, a lock held past lockTimeout): said
    in the log and the metrics, and the attachment judged later as one from before installation."""
    from cni_reaper.state import counters

    log.error("the attachment was not recorded (cni-reaper's own bookkeeping); the allocation goes on, and it is "
              "judged later as one from before installation (libcni's cache, host-local's reservations)",
              error=getattr(err, "msg", None) or f"{type(err).__name__}: {err}",
              fix=getattr(err, "details", "") or "check the state directory's free space and permissions")
    counters.unrecorded(inv.conf.stateDir)


def _record_after_the_answer(inv: Invocation, current: Life) -> None:
    """The recording (and the look at who else maps its host ports) of an ADD that answered while another
    process held the state lock: it waits lockTimeout now. Never raises."""
    try:
        _record(inv, current)
    except Exception as err:  # noqa: BLE001 - nobody is left to hear it: logged and counted
        _unrecorded(inv, err)
    if inv.conf.portMappings:
        _look_at_host_ports(inv, current)


def _record(inv: Invocation, current: Life, wait: float | None = None) -> bool:
    """Record the new life under the state lock (its addresses are protected from then on), then sweep what
    dead attachments left. Returns whether libcni caches an attachment that has no record (one from before
    installation, or of a network without cni-reaper: it may map the host ports this ADD was given)."""
    conf = inv.conf
    with Store.session(conf.stateDir, conf.lockTimeout, wait=wait) as store:
        if store.waited > 0.1:
            log.info("waited for the state lock", seconds=round(store.waited, 3))
        existing = store.load(conf.name, inv.container_id, inv.ifname)
        record, kept = merge(existing, conf.name, inv.container_id, inv.ifname, current, inv.args,
                             RecordSettings.of_conf(conf))
        store.save(record)
        if kept:
            log.info("re-added: earlier life kept for clean-up", earlier=len(record.earlier))
        _sweep(inv, store, current)
        return bool(conf.portMappings) and _cached_unrecorded(store, conf)


def _cached_unrecorded(store: Store, conf: Any) -> bool:
    """Whether the look at who else maps this ADD's host ports goes before its answer (reap/cache.unrecorded).
    What it cannot tell (a cache entry that is no object of the shape it reads) says yes: the record is saved
    by then, and the look before the answer is the safe side."""
    from cni_reaper.reap.engine import cached_unrecorded

    try:
        return cached_unrecorded(conf.cniCacheDir, store.attached, conf.name)
    except Exception as err:  # noqa: BLE001 - never the ADD's bookkeeping: the record is saved
        log.warn("libcni's cache could not be compared with the records; looking before the answer",
                 error=f"{type(err).__name__}: {err}"[:200])
        return True


def _sweep(inv: Invocation, store: Store, current: Life) -> None:
    """The sweep of an ADD (engine.add_pass); for one that maps host ports, after its answer (cni/afterwards.py),
    a look at who else maps them (`_look_at_host_ports`). Never fails the ADD."""
    from cni_reaper.reap.engine import add_pass

    add_pass(store, inv.conf)


def _look(inv: Invocation, current: Life, before_the_answer: bool) -> None:
    """Who else maps this ADD's host ports: before its answer when a leak may map them (#11901: libcni caches an
    attachment with no record) and the state lock is free within LOOK_WAIT; else after it (cni/afterwards.py),
    once the state lock is let go (the look takes it); holders is not imported here."""
    if before_the_answer and _look_at_host_ports(inv, current, LOOK_WAIT):
        return
    from cni_reaper.cni.afterwards import later

    later(lambda: _after_the_answer(inv, current), inv.conf.stateDir)


def _after_the_answer(inv: Invocation, current: Life) -> None:
    _look_at_host_ports(inv, current)


LOOK_WAIT = 0.5  # seconds the look before an ADD's answer waits for the state lock (then it runs after the answer)


def _look_at_host_ports(inv: Invocation, current: Life, wait: float | None = None) -> bool:
    """Who else maps the host ports this ADD was given (engine.port_look): the look reads the hostport tables
    with the tools of each world (milliseconds). Before the answer (`wait`: how long the state lock may be
    waited for) it returns False when the lock stayed held (the look is then left for after the answer); after
    it, True. Never raises."""
    from cni_reaper.reap.engine import port_look

    try:
        store = Store(inv.conf.stateDir, inv.conf.lockTimeout).open()
    except Exception as exc:  # noqa: BLE001 - a look at other allocations never fails this one: it is only logged
        log.warn("who else maps this allocation's host ports was not looked at", error=f"{type(exc).__name__}: {exc}")
        return True
    try:
        port_look(store, inv.conf, inv.container_id, host_ports(inv.conf), current, wait)
    except CniError as err:
        if wait is not None and err.code == TRY_AGAIN_LATER:
            return False
        log.warn("who else maps this allocation's host ports was not looked at", error=err.msg)
    except Exception as exc:  # noqa: BLE001 - a look at other allocations never fails this one
        log.warn("who else maps this allocation's host ports was not looked at", error=f"{type(exc).__name__}: {exc}")
    finally:
        store.close()
    return True
