"""STATUS: can an ADD be served? Cheap: a few stat calls, and with nothing stale no subprocess (Nomad 1.9.5+
calls it before every ADD and DEL).

Only an unusable state directory makes STATUS fail: Nomad (1.9.5+) skips the whole DEL of an allocation when
STATUS fails, so a clean-up that cannot run (iptables missing or broken, the xtables lock held) is logged by
the sweep and retried later, never reported as "unavailable"."""

from __future__ import annotations

import os
import stat

from cni_reaper.errors import STATUS_NOT_AVAILABLE, CniError


def _state_dir_problem(path: str) -> str | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path.rstrip("/")) or "/"
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.access(parent, os.W_OK):
            return f"state directory {path} does not exist and {parent} is not writable"
        return None
    except OSError as exc:
        return f"state directory {path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"state directory {path} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return f"state directory {path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"state directory {path} is owned by uid {st.st_uid}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"state directory {path} is not writable"
    return None


def run(inv):
    conf = inv.conf
    problem = _state_dir_problem(conf.stateDir)
    if problem:
        raise CniError(STATUS_NOT_AVAILABLE, f"cni-reaper cannot serve ADD: {problem}",
                       "make stateDir a directory of root's (mode 0700), or point stateDir at one, then retry")
    _opportunistic_sweep(conf)
    return None


def _opportunistic_sweep(conf) -> None:
    """Sweep if the state directory exists and nobody holds its lock; STATUS itself never waits or fails."""
    if not os.path.isdir(conf.stateDir):
        return
    from cni_reaper.reap.sweep import sweep_quietly
    from cni_reaper.state.store import Store

    store = Store(conf.stateDir, lock_timeout=0)
    try:
        store.open(create=False)
        with store.locked():
            sweep_quietly(store, conf)
    except CniError:
        pass
    finally:
        store.close()
