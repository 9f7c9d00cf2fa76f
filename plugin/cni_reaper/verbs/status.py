"""STATUS: can an ADD be served? Cheap: a few stat calls, and with nothing stale no subprocess (Nomad 1.9.5+
calls it before every ADD and DEL).

Only an unusable state directory makes STATUS fail: Nomad (1.9.5+) skips the whole DEL of an allocation when
STATUS fails, so a clean-up that cannot run (iptables missing or broken, the xtables lock held) is logged by
the sweep and retried later, never reported as "unavailable". Its sweep is the one a recreate needs (the
old life's reservation released before bridge's ADD): it waits for the state lock as ADD does, logs when it
had to, and when the lock stays held says so (the next call sweeps again). The old life's veth goes only
when the kernel has taken its namespace down, some time after the runtime removed it (under load, seconds):
its sweep waits for that veth, for half the hold of the state lock (evidence.View's `recreate_wait`)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.cni.shell import Invocation

from cni_reaper import log
from cni_reaper.errors import STATUS_NOT_AVAILABLE, TRY_AGAIN_LATER, CniError
from cni_reaper.state.safedir import problem as state_dir_problem


def run(inv: Invocation) -> None:
    conf = inv.conf
    problem = state_dir_problem(conf.stateDir)
    if problem:
        raise CniError(STATUS_NOT_AVAILABLE, f"cni-reaper cannot serve ADD: {problem}",
                       "make stateDir a directory of root's (mode 0700), or point stateDir at one, then retry")
    _sweep(conf)
    return None


def _sweep(conf: Any) -> None:
    """Sweep if the state directory exists; STATUS itself never fails for it."""
    if not os.path.isdir(conf.stateDir):
        return
    from cni_reaper.files import hold_seconds
    from cni_reaper.reap.evidence import View
    from cni_reaper.reap.sweep import sweep_quietly
    from cni_reaper.state.store import Store

    store = Store(conf.stateDir, conf.lockTimeout)
    try:
        store.open(create=False)
        with store.locked():
            if store.waited > 0.1:
                log.info("waited for the state lock", seconds=round(store.waited, 3))
            # a recreate's old life: its namespace, replaced at its path, may still be in the kernel's hands;
            # half the hold at most, the other half left to the clean-up's tools
            sweep_quietly(store, conf, view=View(recreate_wait=hold_seconds(conf.lockTimeout) / 2))
    except CniError as err:
        if err.code == TRY_AGAIN_LATER:
            log.warn("sweep skipped: the state lock stayed held; the next call sweeps", error=err.msg)
    finally:
        store.close()
