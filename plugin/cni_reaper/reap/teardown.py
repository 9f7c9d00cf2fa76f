"""A DEL's own attachment (issue 42: the DEL's judgement and bookkeeping behind the engine, as every pass's): what
of it must go before the downstream plugins' DEL, its record marked torn down (the tombstone), the pass with the
sweep of the other dead attachments, and the mark settled. verbs/delete.py hands the call over (`DelCall`) and
answers; wrap/'s early question (`can_wait`: may all of this run beside the real plugin's DEL?) is told with few
imports, before the real plugin runs.

DEL runs first in a chain's DEL (reverse conflist order). The downstream plugins remove what they made when
the recorded life is this DEL's live netns; what they will not remove (another life, a netns gone, a DEL
without port mappings or prevResult) goes now. Never the reservations: bridge's DEL always has host-local release
them (even with no netns), and a reservation released before the firewall plugin's DEL has run could be given
to an attachment whose rules that DEL would then delete.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.reap.evidence import View
    from cni_reaper.reap.outcome import Outcome
    from cni_reaper.reap.targets import Target
    from cni_reaper.state.record import Record
    from cni_reaper.state.store import Store

from cni_reaper import jsonio
from cni_reaper.errors import CniError
from cni_reaper.reap import probes
from cni_reaper.state.names import MAX_RECORD_BYTES, record_name
from cni_reaper.state.record import of_document, problem
from cni_reaper.state.safedir import SafeDir
from cni_reaper.values import DelCall


class NetnsNow:
    """What is at a DEL's CNI_NETNS now, looked at once per DEL under the state lock: the namespace (`ns`, None:
    none is there), or `unseen` (the path cannot be looked at: one may be there)."""

    __slots__ = ("ns", "unseen")

    def __init__(self, path: str | None) -> None:
        try:
            self.ns, self.unseen = probes.netns_id(path), False
        except probes.Unseen:
            self.ns, self.unseen = None, True

    @property
    def maybe_there(self) -> bool:
        return self.unseen or self.ns is not None


def same_life(record: Record, call: DelCall, now: NetnsNow) -> bool:
    """This DEL's netns is the recorded path and holds the very namespace recorded (a path that cannot be
    looked at: not known to, so no)."""
    cur = record.current
    if now.ns is None or call.netns != cur.netns:
        return False
    return cur.netns_id is None or now.ns.same(cur.netns_id)


def nothing_first(record: Record, call: DelCall, now: NetnsNow) -> bool:
    """The common case: the recorded life is this DEL's live netns, the DEL carries the port mappings and
    prevResult, and there is no earlier life: the downstream plugins' DEL removes everything of it."""
    return call.ports and call.prev_result and not record.earlier and same_life(record, call, now)


def can_wait(state_dir: str, call: DelCall) -> bool:
    """Whether, by a look at its record without the lock, nothing of this attachment must go before the
    downstream plugins' DEL: then the tombstone and the sweep may run beside them, the DEL itself judging
    again under the lock. A record that cannot be read or is not of this schema: no (the DEL runs at once)."""
    sd = SafeDir(state_dir)
    try:
        sd.open(create=False, read_only=True)
        data, why = sd.read(record_name(*call.key), MAX_RECORD_BYTES)
        if data is None:
            return why is None  # no record: nothing of it to remove
        doc = jsonio.loads(data)
        return problem(doc) is None and nothing_first(of_document(doc), call, NetnsNow(call.netns))
    except (CniError, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, UnicodeDecodeError):
        return False
    finally:
        sd.close()


def del_pass(conf: Any, call: DelCall, beside: bool, wait: float | None) -> None:
    """The DEL, in a straight line under the state lock (waited `wait` s; None: lockTimeout; CniError 11 when
    it stays held): load its record, judge what of it must go now, mark it torn down, plan and apply that with
    the sweep of the other dead attachments, settle the mark. `beside`: run while the downstream plugins' DEL
    runs (can_wait said nothing must go first)."""
    from cni_reaper import log
    from cni_reaper.reap.evidence import View
    from cni_reaper.reap.sweep import sweep_quietly
    from cni_reaper.state.store import Store

    view = View()
    with Store.session(conf.stateDir, conf.lockTimeout, create=False, wait=wait) as store:
        record = store.load(*call.key)
        if record is None:
            log.info("no record for this attachment; nothing of it to remove")
        now = NetnsNow(call.netns)  # looked at once
        extra, verify = _now(record, call, conf, view, beside, now)
        record = _torn_down(store, record, call, conf, verify, now)
        outcome = sweep_quietly(store, conf, exclude=frozenset({call.key}) if record else frozenset(), extra=extra,
                                view=view)
        _settle(store, record, outcome, extra)


def immediate_targets(record: Record, call: DelCall, conf: Any, view: View, now: NetnsNow) -> list[Target] | None:
    """What of this attachment must go now, before the downstream plugins' DEL runs.

    - The recorded life is this DEL's netns and it is alive: bridge, firewall and portmap tear it down,
      except portmap when DEL carries no port mappings and firewall when DEL carries no prevResult.
    - Otherwise (netns gone, CNI_NETNS empty, or another netns than the recorded one): bridge will skip its
      masquerade teardown, so everything of the recorded lives goes; but while CNI_NETNS is a live namespace
      the masquerade chain itself stays (bridge's DEL would fail on a missing chain; measured on 1.1.1).
    The record is judged as every pass judges one, the runtime's DEL its verdict: None (nothing now, a second
    look later) when its rules are out of this process's reach."""
    if nothing_first(record, call, now):
        return []  # the common case: the downstream plugins remove everything
    same = same_life(record, call, now)
    parts = set()
    if same:
        if not call.ports:
            parts.add("dnat")
        if not call.prev_result:
            parts.add("forward")
    return _targets(record, conf, view, now.maybe_there, same, frozenset(parts))


def _targets(record: Record, conf: Any, view: View, there: bool, same: bool,
             parts: frozenset[str]) -> list[Target] | None:
    """`same`: the DEL's netns is the recorded life's and alive (then only `parts` of the current life, and the
    earlier lives); else every life but the reservations, the masquerade chain kept while a namespace is (or may
    be) at the DEL's netns (`there`). None: out of this process's reach (nothing now; a sweep that reaches them
    takes them)."""
    from cni_reaper.judge import DEAD, Verdict
    from cni_reaper.reap.sweep import dead_target, earlier_target, judge, settings_of
    from cni_reaper.reap.targets import PARTS
    from cni_reaper.state.record import RecordSettings

    s = settings_of(record, {conf.name: conf}) or RecordSettings.of_conf(conf)
    j = judge(record, view, s, conf.cniCacheDir, Verdict(DEAD, "DEL"))
    if j.state != DEAD:
        from cni_reaper import log

        log.info("nothing of this attachment removed before the plugins' DEL; left for a sweep", why=j.why)
        return None
    if not same:
        return [dead_target(j, view, keep_masq_chain=there, parts=PARTS - {"reservation"},
                            lives=list(record.lives))]
    targets = []
    if parts:
        targets.append(dead_target(j, view, keep_masq_chain=True, parts=parts, lives=[record.current]))
    t = earlier_target(j, view) if record.earlier else None
    return targets + ([t] if t is not None else [])


def _now(record: Record | None, call: DelCall, conf: Any, view: View, beside: bool,
         now: NetnsNow) -> tuple[list[Target], bool]:
    """What of the attachment goes now (immediate_targets), and whether its tombstone asks the next sweep for a
    second look (`verify`: something was to go now, or could not be reached)."""
    if record is None:
        return [], False
    extra = immediate_targets(record, call, conf, view, now)
    if extra is None:
        return [], True
    if beside and extra:
        from cni_reaper import log

        # changed since can_wait looked: removing them now would race the plugins' own teardown; the
        # tombstone asks the next sweep for a second look instead
        log.info("something of this attachment is to go that the plugins' DEL may still be removing; "
                 "left for the next sweep")
        return [], True
    return extra, bool(extra)


def _torn_down(store: Store, record: Record | None, call: DelCall, conf: Any, verify: bool,
               now: NetnsNow) -> Record | None:
    """The record marked torn down (its tombstone, unless it has one) and saved."""
    if record is None:
        return None
    if record.deleted is None:
        from cni_reaper.reap.cache import exists
        from cni_reaper.state.record import tombstone

        cache_dir = record.settings.cni_cache_dir if record.settings else conf.cniCacheDir
        record = record.replace(deleted=tombstone(not now.maybe_there, call.prev_result, call.ports, verify=verify,
                                                  cached=exists(cache_dir, *call.key)))
    store.save(record)
    return record


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


def _settle(store: Store, record: Record | None, outcome: Outcome | None, extra: list[Target]) -> None:
    """A tombstone whose DEL removed everything it was to remove needs no second look (`_finished`)."""
    if record is not None and record.deleted is not None and extra and _finished(record, outcome, extra):
        store.save(record.replace(deleted=record.deleted.replace(verify=False)))
