"""Who holds a network namespace, and removing a namespace mount that Nomad left with an allocation its
scheduler says is over (Nomad #11096: an allocation that finished while its client was down keeps its netns
bind mount): the CLI's `sweep --nomad`, never a CNI verb. A backend: it reads /proc and mountinfo, unmounts
and unlinks a path.
"""

from __future__ import annotations

import os

MNT_DETACH = 2
Ident = tuple[int, int]  # (device, inode) of a namespace's nsfs file


class Occupancy:
    """Who holds network namespaces now, seen once from /proc: a thread in it (any thread of any process:
    a plugin or Go's netns.Do enters with setns on one thread only), a process holding a descriptor of it,
    and how many nsfs mounts of it this mount namespace has."""

    __slots__ = ("dirs", "fds", "inside", "mounts", "nsfs")

    def __init__(self, dirs: frozenset[str] = frozenset(), proc: str = "/proc") -> None:
        """`dirs`: the directories the namespaces looked at are mounted in (as the kernel names them: no
        symlink); a descriptor is stat'ed only when it reads as a namespace or as a file there, never one of
        another file system (a FUSE mount that does not answer would hold the sweep)."""
        self.dirs = dirs
        try:
            self.nsfs: int | None = os.stat(f"{proc}/self/ns/net").st_dev
        except OSError:
            self.nsfs = None
        self.inside: dict[Ident, int] = {}
        self.fds: dict[Ident, int] = {}
        self.mounts: dict[int, int] = {}  # inode -> nsfs mounts of it here
        try:
            pids = [p for p in os.listdir(proc) if p.isdigit()]
        except OSError:
            pids = []
        for pid in pids:
            self._threads(proc, pid)
            self._descriptors(proc, pid)
        self._mounts(f"{proc}/self/mountinfo")

    def _threads(self, proc: str, pid: str) -> None:
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            return
        for tid in tids:
            try:
                st = os.stat(f"{proc}/{pid}/task/{tid}/ns/net")
            except OSError:
                continue
            self.inside.setdefault((st.st_dev, st.st_ino), int(pid))

    def _descriptors(self, proc: str, pid: str) -> None:
        """A descriptor of a namespace reads as `net:[N]` when it was opened through /proc, and as the path
        it was opened at (in the opener's view) when through a mount of it: those are looked at (their
        device must be nsfs's)."""
        where = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(where)
        except OSError:
            return
        for fd in fds:
            try:
                target = os.readlink(f"{where}/{fd}")
                if not (target.startswith("net:[") or os.path.dirname(target) in self.dirs):
                    continue
                st = os.stat(f"{where}/{fd}")
            except OSError:
                continue
            if st.st_dev == self.nsfs:
                self.fds.setdefault((st.st_dev, st.st_ino), int(pid))

    def _mounts(self, mountinfo: str) -> None:
        try:
            with open(mountinfo, "rb") as f:
                lines = f.read().split(b"\n")
        except OSError:
            return
        for line in lines:
            fields = line.split(b" ")
            if len(fields) > 4 and fields[3].startswith(b"net:[") and fields[3].endswith(b"]"):
                ino = fields[3][5:-1]
                if ino.isdigit():
                    self.mounts[int(ino)] = self.mounts.get(int(ino), 0) + 1

    def process_in(self, ns: Ident) -> int | None:
        return self.inside.get(ns)

    def held_otherwise(self, ns: Ident) -> str | None:
        """Why the namespace would outlive the removal of its one mount (None: nothing else holds it here)."""
        if ns in self.fds:
            return f"process {self.fds[ns]} holds a descriptor of it"
        if self.mounts.get(ns[1], 0) > 1:
            return "it is mounted at another path too"
        return None


def remove(path: str) -> str | None:
    """Unmount the namespace at `path` (detached) and remove the file, as `ip netns delete` does; None when
    done, else why not, in words."""
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
