"""STATUS: can an ADD be served? Cheap: a few stat calls, no subprocess (Nomad calls it before every ADD and DEL)."""

from __future__ import annotations

import os
import stat

from .. import flavour
from ..errors import STATUS_NOT_AVAILABLE, CniError


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
    problems = []
    state = _state_dir_problem(conf.stateDir)
    if state:
        problems.append(state)
    found, why = flavour.detect(conf.backend)
    if found is None:
        problems.append(why)
    if problems:
        raise CniError(STATUS_NOT_AVAILABLE, "cni-reaper cannot serve ADD: " + "; ".join(problems),
                       "fix the state directory (stateDir) or install iptables, then retry")
    _opportunistic_sweep(conf)
    return None


def _opportunistic_sweep(conf) -> None:
    """Sweep if the state directory exists and nobody holds its lock; STATUS itself never waits or fails."""
    if not os.path.isdir(conf.stateDir):
        return
    from ..store import Store
    from ..sweep import sweep_quietly

    store = Store(conf.stateDir, lock_timeout=0)
    try:
        store.open(create=False)
        with store.locked():
            sweep_quietly(store, conf)
    except CniError:
        pass
    finally:
        store.close()
