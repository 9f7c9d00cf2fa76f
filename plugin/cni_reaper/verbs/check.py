"""CHECK: the record must describe this attachment. A missing or stale record is repaired, not failed:
Nomad destroys and recreates the allocation's network when CHECK fails."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.cni.shell import Invocation
    from cni_reaper.state.record import Life

from cni_reaper import log
from cni_reaper.errors import INVALID_CONFIG, TRY_AGAIN_LATER, UNKNOWN_CONTAINER, CniError
from cni_reaper.reap import probes
from cni_reaper.reap.engine import verb_pass
from cni_reaper.state.record import RecordSettings, merge, same_life
from cni_reaper.state.store import BRIEF_WAIT, Store
from cni_reaper.verbs.recording import current_life


def run(inv: Invocation) -> None:
    conf = inv.conf
    if conf.prevResult is None:
        raise CniError(INVALID_CONFIG, "CHECK needs prevResult",
                       "cni-reaper must be chained after an interface-creating plugin")
    current = current_life(inv)
    if current.netns_id is None and probes.maybe_there(inv.netns):
        # the path cannot be looked at (EACCES, EIO, ...): nothing is known of it, so nothing is judged,
        # recorded or failed (a failed CHECK makes the runtime destroy the allocation's network)
        log.warn("CHECK cannot look at the netns path; the record is left as it is", netns=inv.netns)
        return None
    if current.netns_id is None:
        raise CniError(UNKNOWN_CONTAINER, f"{inv.netns} is not a network namespace",
                       "the container's network namespace is gone; the runtime should recreate the network")
    try:
        _adopt(inv, current, BRIEF_WAIT)
    except CniError as err:
        if err.code != TRY_AGAIN_LATER or conf.lockTimeout <= BRIEF_WAIT:
            _not_adopted(err)
        else:  # another process holds the state lock: the allocation does not wait for it
            from cni_reaper.cni.afterwards import later

            log.info("the state lock is held by another process: the record is looked at after the answer")
            later(lambda: _adopt_after_the_answer(inv, current), conf.stateDir)
    except Exception as err:  # noqa: BLE001 - its own bookkeeping never fails a CHECK (OSError, a damaged file)
        _not_adopted(err)
    return None


def _not_adopted(err: Exception) -> None:
    """Its own bookkeeping never fails a CHECK (Nomad would recreate the network): logged."""
    log.error("CHECK could not look at or repair the record; the allocation goes on",
              error=getattr(err, "msg", None) or f"{type(err).__name__}: {err}",
              fix=getattr(err, "details", "") or "check the state directory's free space and permissions")


def _adopt_after_the_answer(inv: Invocation, current: Life) -> None:
    try:
        _adopt(inv, current)
    except Exception as err:  # noqa: BLE001 - nobody is left to hear it: logged
        _not_adopted(err)


def _adopt(inv: Invocation, current: Life, wait: float | None = None) -> None:
    """The record must describe this attachment: a record of cni-reaper 0.2 gets what it lacks; a missing or
    stale one is repaired (the earlier life kept for clean-up); then the sweep."""
    conf = inv.conf
    settings = RecordSettings.of_conf(conf)
    with Store.session(conf.stateDir, conf.lockTimeout, wait=wait) as store:
        existing = store.load(conf.name, inv.container_id, inv.ifname)
        if existing is not None and existing.deleted is None and same_life(existing.current, current):
            if existing.settings is None:  # a record of cni-reaper 0.2: keep what it proved, add the rest
                record, _ = merge(existing, conf.name, inv.container_id, inv.ifname, current,
                                  inv.args or existing.cni_args, settings)
                store.save(record)
            verb_pass(store, conf)
            return
        record, _ = merge(existing, conf.name, inv.container_id, inv.ifname, current,
                          inv.args or (existing.cni_args if existing else {}), settings)
        store.save(record)
        if existing is None:
            log.info("CHECK adopted an attachment that had no record")
        else:
            log.warn("CHECK found a stale record and repaired it; the earlier life is kept for clean-up")
        verb_pass(store, conf)
