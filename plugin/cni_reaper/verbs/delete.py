"""DEL: cni-reaper runs first in a DEL (reverse conflist order). It hands the call to the engine
(reap/teardown.py: what of the attachment must go before the downstream plugins' DEL, its record marked torn
down, the sweep of other dead attachments). As the wrapper of portmap, when nothing of the attachment must go
first (engine.can_wait), all of it runs beside the real plugin's DEL (Invocation.later). Best effort: DEL never
fails because of cni-reaper's own state or clean-up."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.cni.shell import Invocation

from cni_reaper import log
from cni_reaper.errors import CniError
from cni_reaper.values import DelCall, Key


def run(inv: Invocation) -> None:
    conf = inv.conf
    if conf.stateDir is None:
        log.warn("DEL has no usable state directory; nothing of this attachment can be looked up")
        return None
    call = _call(inv)
    if inv.later is not None:
        from cni_reaper.reap.engine import can_wait

        if can_wait(conf.stateDir, call):
            inv.later.append(lambda: _run(inv, call, beside=True))
            return None
    return _run(inv, call)


def _call(inv: Invocation) -> DelCall:
    conf = inv.conf
    return DelCall(Key(conf.name, inv.container_id, inv.ifname), inv.netns, bool(conf.portMappings),
                   conf.prevResult is not None)


def _run(inv: Invocation, call: DelCall, beside: bool = False) -> None:
    """The DEL's pass (engine.del_pass), waited BRIEF_WAIT for the state lock (lockTimeout when it runs beside
    the downstream plugins' DEL or after the answer)."""
    from cni_reaper.errors import TRY_AGAIN_LATER
    from cni_reaper.reap.engine import del_pass
    from cni_reaper.state.store import BRIEF_WAIT

    conf = inv.conf
    try:
        del_pass(conf, call, beside, None if beside else BRIEF_WAIT)
    except CniError as err:
        if err.code == TRY_AGAIN_LATER and not beside and conf.lockTimeout > BRIEF_WAIT:
            # another process holds the state lock: the allocation does not wait for it; the DEL's own part runs
            # after the answer, beside the other plugins' DEL (what must go first is left for the next sweep)
            from cni_reaper.cni.afterwards import later

            log.info("the state lock is held by another process: this DEL's part runs after the answer")
            later(lambda: _after_the_answer(inv, call), conf.stateDir)
            return None
        # The record stays as it was; its netns will be gone, so a later sweep still finds it dead.
        log.warn("DEL could not use the state directory; continuing", error=err.msg, details=err.details)
    except Exception as exc:  # noqa: BLE001 - its own bookkeeping never fails a DEL (OSError, a damaged file)
        log.warn("DEL could not use the state directory; continuing", error=f"{type(exc).__name__}: {exc}")
    return None


def _after_the_answer(inv: Invocation, call: DelCall) -> None:
    try:
        _run(inv, call, beside=True)
    except Exception as exc:  # noqa: BLE001 - nobody is left to hear it: logged
        log.warn("DEL's part after the answer failed", error=f"{type(exc).__name__}: {exc}")
