"""DEL: cni-reaper runs first in a DEL (reverse conflist order). It removes at once what the downstream
plugins will not, marks the record torn down (a tombstone), and sweeps other dead attachments. As the
wrapper of portmap, when nothing of the attachment must go first (verbs/teardown_first.py), all of it runs beside
the real plugin's DEL (Invocation.later). Best effort: DEL never fails because of cni-reaper's own state or
clean-up."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.cni.shell import Invocation
    from cni_reaper.reap.engine import Outcome, Target, View
    from cni_reaper.state.record import Record
    from cni_reaper.state.store import Store

# the rest (the store, the evidence, the sweep) is imported by the DEL itself: run beside the real plugin in
# wrap mode, its imports are too
from cni_reaper import log
from cni_reaper.errors import CniError
from cni_reaper.verbs.teardown_first import NetnsNow, can_wait, nothing_first, same_life


def immediate_targets(record: Record, inv: Invocation, view: View, now: NetnsNow | None = None) -> list[Target] | None:
    """What of this attachment must go now, before the downstream plugins' DEL runs.

    - The recorded life is this DEL's netns and it is alive: bridge, firewall and portmap tear it down,
      except portmap when DEL carries no port mappings and firewall when DEL carries no prevResult.
    - Otherwise (netns gone, CNI_NETNS empty, or another netns than the recorded one): bridge will skip its
      masquerade teardown, so everything of the recorded lives goes; but while CNI_NETNS is a live namespace
      the masquerade chain itself stays (bridge's DEL would fail on a missing chain; measured on 1.1.1).
    Never the reservations: bridge's DEL always has host-local release them (even with no netns), and a
    reservation released before the firewall plugin's DEL has run could be given to an attachment whose
    rules that DEL would then delete. The record is judged as every sweep judges one (sweep.judge), the
    runtime's DEL its verdict: None (nothing now, a second look later) when its rules are out of this
    process's reach."""
    conf = inv.conf
    now = now if now is not None else NetnsNow(inv.netns)  # looked at once
    if nothing_first(record, inv, now):
        return []  # the common case: the downstream plugins remove everything; nothing to import
    same = same_life(record, inv, now)
    parts = set()
    if same:
        if not conf.portMappings:
            parts.add("dnat")
        if conf.prevResult is None:
            parts.add("forward")
    from cni_reaper.reap.engine import del_targets

    # None: out of this process's reach (logged): its tombstone asks a sweep that reaches them (verify)
    return del_targets(record, conf, view, now.maybe_there, same, frozenset(parts))


def _finished(record: Record, outcome: Outcome | None, extra: list[Target]) -> bool:
    """Whether this DEL's own clean-up removed everything it was to remove: then its tombstone needs no second
    look, which could only find a new life of the same container by then (same chains, perhaps the same
    address). Not when something failed, could not be looked at, was left on purpose, or only observed; not
    when its masquerade chain was kept for the plugins' DEL while another namespace is at its path (bridge
    finds none of its addresses there and leaves the chain: the sweep after the DEL takes it); not while
    something not ours holds a leftover of it (held: its mark stays, and so does the look)."""
    if outcome is None or (record.left is not None and record.left.retry_at is not None):
        return False
    if any(t.keep_masq_chain and "masq" in t.parts for t in extra):
        return False
    k = record.key
    return (k not in outcome.kept and k not in outcome.would and k not in outcome.held and not outcome.errors
            and not outcome.spared_of(k))


def _now(record: Record | None, inv: Invocation, view: View, beside: bool, now: NetnsNow) -> tuple[list[Target], bool]:
    """What of the attachment goes now (immediate_targets), and whether its tombstone asks the next sweep for a
    second look (`verify`: something was to go now, or could not be reached)."""
    if record is None:
        return [], False
    extra = immediate_targets(record, inv, view, now)
    if extra is None:
        return [], True
    if beside and extra:
        # changed since can_wait looked: removing them now would race the plugins' own teardown; the
        # tombstone asks the next sweep for a second look instead
        log.info("something of this attachment is to go that the plugins' DEL may still be removing; "
                 "left for the next sweep")
        return [], True
    return extra, bool(extra)


def _torn_down(store: Store, record: Record | None, inv: Invocation, verify: bool, now: NetnsNow) -> Record | None:
    """The record marked torn down (its tombstone, unless it has one) and saved."""
    if record is None:
        return None
    if record.deleted is None:
        from cni_reaper.reap.engine import cached_by_libcni
        from cni_reaper.state.record import tombstone

        conf = inv.conf
        cache_dir = record.settings.cni_cache_dir if record.settings else conf.cniCacheDir
        record = record.replace(deleted=tombstone(
            not now.maybe_there, conf.prevResult is not None, bool(conf.portMappings),
            verify=verify, cached=cached_by_libcni(cache_dir, *record.key)))
    store.save(record)
    return record


def _settle(store: Store, record: Record | None, outcome: Outcome | None, extra: list[Target]) -> None:
    """A tombstone whose DEL removed everything it was to remove needs no second look (`_finished`)."""
    if record is not None and record.deleted is not None and extra and _finished(record, outcome, extra):
        store.save(record.replace(deleted=record.deleted.replace(verify=False)))


def run(inv: Invocation) -> None:
    conf = inv.conf
    if conf.stateDir is None:
        log.warn("DEL has no usable state directory; nothing of this attachment can be looked up")
        return None
    if inv.later is not None and can_wait(inv):
        inv.later.append(lambda: _run(inv, beside=True))
        return None
    return _run(inv)


def _run(inv: Invocation, beside: bool = False) -> None:
    """The DEL, in a straight line under the state lock: load its record, judge what of it must go now,
    mark it torn down, plan and apply that with the sweep of the other dead attachments, settle the mark.
    `beside`: run while the downstream plugins' DEL runs (can_wait said nothing must go first)."""
    from cni_reaper.errors import TRY_AGAIN_LATER
    from cni_reaper.reap.engine import View
    from cni_reaper.state.store import BRIEF_WAIT, Store

    conf = inv.conf
    view = View()
    try:
        with Store.session(conf.stateDir, conf.lockTimeout, create=False, wait=None if beside else BRIEF_WAIT) as store:
            record = store.load(conf.name, inv.container_id, inv.ifname)
            if record is None:
                log.info("no record for this attachment; nothing of it to remove")
            now = NetnsNow(inv.netns)
            extra, verify = _now(record, inv, view, beside, now)
            record = _torn_down(store, record, inv, verify, now)
            from cni_reaper.reap.engine import verb_pass

            exclude = frozenset({record.key}) if record is not None else frozenset()
            outcome = verb_pass(store, conf, exclude=exclude, extra=extra, view=view)
            _settle(store, record, outcome, extra)
    except CniError as err:
        if err.code == TRY_AGAIN_LATER and not beside and conf.lockTimeout > BRIEF_WAIT:
            # another process holds the state lock: the allocation does not wait for it; the DEL's own part runs
            # after the answer, beside the other plugins' DEL (what must go first is left for the next sweep)
            from cni_reaper.cni.afterwards import later

            log.info("the state lock is held by another process: this DEL's part runs after the answer")
            later(lambda: _after_the_answer(inv), conf.stateDir)
            return None
        # The record stays as it was; its netns will be gone, so a later sweep still finds it dead.
        log.warn("DEL could not use the state directory; continuing", error=err.msg, details=err.details)
    except Exception as exc:  # noqa: BLE001 - its own bookkeeping never fails a DEL (OSError, a damaged file)
        log.warn("DEL could not use the state directory; continuing", error=f"{type(exc).__name__}: {exc}")
    return None


def _after_the_answer(inv: Invocation) -> None:
    try:
        _run(inv, beside=True)
    except Exception as exc:  # noqa: BLE001 - nobody is left to hear it: logged
        log.warn("DEL's part after the answer failed", error=f"{type(exc).__name__}: {exc}")
