"""What of an attachment a DEL must remove before the downstream plugins' DEL, told with few imports: the
wrapper asks before it runs the real plugin, and when nothing must go first it runs the rest of cni-reaper's
DEL (its imports included) while the real plugin runs."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.cni.shell import Invocation
    from cni_reaper.state.record import Record

from cni_reaper import jsonio
from cni_reaper.errors import CniError
from cni_reaper.reap import probes
from cni_reaper.state.names import MAX_RECORD_BYTES, record_name
from cni_reaper.state.record import of_document, problem
from cni_reaper.state.safedir import SafeDir


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


def same_life(record: Record, inv: Invocation, now: NetnsNow | None = None) -> bool:
    """This DEL's netns is the recorded path and holds the very namespace recorded (a path that cannot be
    looked at: not known to, so no). `now`: what is at the path, if it was looked at already."""
    cur = record.current
    now = now if now is not None else NetnsNow(inv.netns)
    if now.ns is None or inv.netns != cur.netns:
        return False
    return cur.netns_id is None or now.ns.same(cur.netns_id)


def nothing_first(record: Record, inv: Invocation, now: NetnsNow | None = None) -> bool:
    """The common case: the recorded life is this DEL's live netns, the DEL carries the port mappings and
    prevResult, and there is no earlier life: the downstream plugins' DEL removes everything of it."""
    conf = inv.conf
    return (bool(conf.portMappings) and conf.prevResult is not None and not record.earlier
            and same_life(record, inv, now))


def can_wait(inv: Invocation) -> bool:
    """Whether, by a look at its record without the lock, nothing of this attachment must go before the
    downstream plugins' DEL: then the tombstone and the sweep may run beside them, the DEL itself judging
    again under the lock. A record that cannot be read or is not of this schema: no (the DEL runs at once)."""
    conf = inv.conf
    sd = SafeDir(conf.stateDir)
    try:
        sd.open(create=False, read_only=True)
        data, why = sd.read(record_name(conf.name, inv.container_id, inv.ifname), MAX_RECORD_BYTES)
        if data is None:
            return why is None  # no record: nothing of it to remove
        doc = jsonio.loads(data)
        return problem(doc) is None and nothing_first(of_document(doc), inv)
    except (CniError, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, UnicodeDecodeError):
        return False
    finally:
        sd.close()
