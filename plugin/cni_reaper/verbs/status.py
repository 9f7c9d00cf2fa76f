"""STATUS: can an ADD be served? A readiness question, answered at once: a few stat calls, and with nothing
stale no subprocess (Nomad 1.9.5+ calls it before every ADD and DEL).

cni-reaper's STATUS never fails: Nomad (1.9.5+) refuses every ADD and skips the whole DEL of an allocation
when STATUS fails, and an ADD is served whatever cni-reaper's own state (its bookkeeping never fails one: an
unusable state directory, read-only, a symlink, another user's, means unrecorded attachments, an error in the
log and doctor's `state-dir` FAIL). A clean-up that cannot run (iptables missing or broken, the xtables lock
held) is logged by the sweep and retried later, never reported as "unavailable". Its sweep is the one a recreate needs (the
old life's reservation released before bridge's ADD), and runs only when the state lock is free: STATUS
waits for it LOCK_WAIT at most (another allocation's call holds it for milliseconds), never `lockTimeout`
(an operator's `sweep --apply --lock-timeout 60` holds it for as long as it runs); when it stays held the
sweep is skipped, said in the log, and the next call sweeps, unless a recreate is forming in a network that cleans
(`_recreate_forming`): then it waits for the lock up to lockTimeout, since the ADD that follows needs this sweep,
but never for a holder that is stopped (it lets go of nothing). The old life's veth goes only when the kernel
has taken its namespace down, some time after the runtime removed it (under load, seconds): STATUS waits
for that veth (up to RECREATE_WAIT after the new namespace was made, no lock held; none that a thread is
still in) and sweeps again once it went."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.cni.shell import Invocation
    from cni_reaper.reap.engine import View

from cni_reaper import log
from cni_reaper.errors import TRY_AGAIN_LATER, CniError
from cni_reaper.state.safedir import problem as state_dir_problem


def run(inv: Invocation) -> None:
    conf = inv.conf
    problem = state_dir_problem(conf.stateDir)
    if problem:  # the allocations go on unrecorded: said, never failed (Nomad would refuse every ADD)
        log.error("the state directory cannot be used: attachments are not recorded, and nothing is swept",
                  problem=problem, fix="make stateDir a writable directory of root's (mode 0700), or point stateDir "
                  "at one; `cni-reaper doctor` checks it")
        return None
    _sweep(conf)
    return None


RECREATE_WAIT = 5.0  # seconds after a namespace was put at a recorded path that its old veth is waited for
LOCK_WAIT = 0.5  # seconds STATUS waits for the state lock (never lockTimeout: it answers at once)


def _sweep(conf: Any) -> None:
    """Sweep if the state directory exists; STATUS itself never fails for it. The veths of namespaces just
    replaced at a recorded path (a recreate's old life, in the kernel's hands) are waited for with no lock
    held; when one went, the sweep runs again and finds that life dead."""
    if not os.path.isdir(conf.stateDir):
        return
    from cni_reaper.reap.engine import await_lingering, host_view

    view = host_view(recreate_wait=RECREATE_WAIT)
    _locked_sweep(conf, view)
    if not view.lingering:
        return
    try:
        went = await_lingering(view)
    except Exception as exc:  # noqa: BLE001 - STATUS never fails for a look (Nomad would skip the DEL)
        log.warn("the wait for a replaced namespace's veth failed", error=f"{type(exc).__name__}: {exc}")
        return
    if went:
        _locked_sweep(conf, host_view())


def _locked_sweep(conf: Any, view: View) -> None:
    """The verb's sweep under the state lock, waited for LOCK_WAIT; longer (up to lockTimeout, a LOCK_WAIT at a
    time) only while a recreate is forming in a network that cleans and the lock's holders are not stopped."""
    import time

    from cni_reaper.reap.engine import verb_pass
    from cni_reaper.state.store import Store

    deadline: float | None = None
    while True:
        try:
            with Store.session(conf.stateDir, conf.lockTimeout, create=False, wait=LOCK_WAIT) as store:
                verb_pass(store, conf, view=view)
            return
        except CniError as err:
            if err.code != TRY_AGAIN_LATER:
                return
            if deadline is None and _recreate_forming(conf):
                # the ADD that follows fails in host-local unless this sweep releases the old life's reservation
                log.info("a namespace was put at a recorded path (a recreate): STATUS waits for the state lock",
                         error=err.msg)
                deadline = time.monotonic() + conf.lockTimeout
            if not _wait_more(conf, deadline, err):
                return
        except Exception as exc:  # noqa: BLE001 - STATUS never fails
            log.warn("STATUS's sweep failed; the next call sweeps", error=f"{type(exc).__name__}: {exc}")
            return


def _wait_more(conf: Any, deadline: float | None, err: CniError) -> bool:
    """Whether STATUS waits another LOCK_WAIT for the state lock: only for a recreate (`deadline`), not past it,
    and not for a holder that is stopped (it lets go of nothing). Says in the log why it does not."""
    import time

    from cni_reaper.files import holders_stopped
    from cni_reaper.state.store import LOCK_NAME

    if deadline is None or time.monotonic() >= deadline:
        log.info("sweep skipped: another process holds the state lock; STATUS answered, the next call sweeps",
                 error=err.msg)
        return False
    if holders_stopped(os.path.join(conf.stateDir, LOCK_NAME)):
        log.warn("sweep skipped: the process holding the state lock is stopped; STATUS answered",
                 fix="resume or end it (a suspended `cni-reaper sweep`?): until then nothing is swept")
        return False
    return True


def _recreate_forming(conf: Any) -> bool:
    """Read without the state lock (another process holds it): whether a recorded life that no DEL tore down has
    another namespace at its netns path now, a recreate forming (Nomad, after a failed CHECK: a new namespace at
    the same path, STATUS, then ADD with no DEL), in a network that cleans (observed, the sweep would release
    nothing). Its STATUS is the sweep that releases the old life's reservation: without it bridge's ADD fails
    ("duplicate allocation"). Never raises."""
    from cni_reaper.reap import probes
    from cni_reaper.state.modes import observing
    from cni_reaper.state.store import Store

    try:
        store = Store(conf.stateDir, conf.lockTimeout).open(create=False, read_only=True)
    except (CniError, OSError):
        return False
    try:
        for r in store.records():
            recorded = r.current.netns_id
            if r.deleted is not None or recorded is None:
                continue
            try:
                now = probes.netns_id(r.current.netns)
            except probes.Unseen:
                continue
            if now is not None and not now.same(recorded) and not observing(store, conf, r.key.network):
                return True
    except Exception:  # noqa: BLE001 - a look for a recreate never fails STATUS: no wait then
        return False
    finally:
        store.close()
    return False
