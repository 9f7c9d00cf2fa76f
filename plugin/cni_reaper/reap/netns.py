"""Removing a network namespace mount that Nomad left with an allocation its scheduler says is over (Nomad
#11096: an allocation that finished while its client was down keeps its netns bind mount): the CLI's
`sweep --nomad --nomad-remove-netns`, never a CNI verb. A backend: it unmounts and unlinks a path, and says
which process (if any) is still in the namespace, in which case nothing is done.
"""

from __future__ import annotations

import os

MNT_DETACH = 2


def occupant(dev: int, ino: int, proc: str = "/proc") -> int | None:
    """A process whose network namespace is (dev, ino), or None when there is none (or none can be seen)."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            st = os.stat(f"{proc}/{pid}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (dev, ino):
            return int(pid)
    return None


def remove(path: str) -> str | None:
    """Unmount the namespace at `path` (detached: a process that opened it keeps it) and remove the file, as
    `ip netns delete` does; None when done, else why not, in words."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err != 22:  # EINVAL: not a mount point (a path Nomad no longer mounts): the file alone goes
            return f"cannot unmount {path}: {os.strerror(err)}"
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"cannot remove {path}: {exc.strerror} (run the sweep in the host's mount namespace, as root)"
    return None
