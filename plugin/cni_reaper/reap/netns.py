"""Who holds a network namespace, and removing a namespace mount that Nomad left with an allocation its
scheduler says is over (Nomad #11096: an allocation that finished while its client was down keeps its netns
bind mount): the CLI's `sweep --nomad`, never a CNI verb. A backend: it reads /proc and mountinfo, unmounts
and unlinks a path.
"""

from __future__ import annotations

import errno
import os

MNT_DETACH = 2
Ident = tuple[int, int]  # (device, inode) of a namespace's nsfs file
_DENIED = (errno.EACCES, errno.EPERM)


class Occupancy:
    """Who holds network namespaces now, seen once from /proc: a thread in it (any thread of any process:
    a plugin or Go's netns.Do enters with setns on one thread only), a process holding a descriptor of it,
    and where it is mounted, in every mount namespace a process is in. What could not be looked at is kept
    too (`blind_threads`, `blind_fds`): a holder not seen is no proof that there is none."""

    __slots__ = ("blind_fds", "blind_threads", "dirs", "fds", "inside", "mounts", "nsfs")

    def __init__(self, dirs: frozenset[str] = frozenset(), proc: str = "/proc", threads_only: bool = False) -> None:
        """`dirs`: the directories the namespaces looked at are mounted in (as the kernel names them: no
        symlink); a descriptor is stat'ed only when it reads as a namespace or as a file there, never one of
        another file system (a FUSE mount that does not answer would hold the sweep). `threads_only`: who is
        in a namespace, no more (descriptors and mounts are not looked at)."""
        self.dirs = dirs
        try:
            self.nsfs: int | None = os.stat(f"{proc}/self/ns/net").st_dev
        except OSError:
            self.nsfs = None
        self.inside: dict[Ident, int] = {}
        self.fds: dict[Ident, int] = {}
        self.mounts: dict[int, set[bytes]] = {}  # inode -> the mount points of nsfs mounts of it
        self.blind_threads: list[int] = []
        self.blind_fds: list[int] = []
        try:
            pids = [p for p in os.listdir(proc) if p.isdigit()]
        except OSError:
            pids = []
        seen_mnt: set[int] = set()
        for pid in pids:
            self._threads(proc, pid)
            if not threads_only:
                self._descriptors(proc, pid)
                self._mounts(proc, pid, seen_mnt)

    def _threads(self, proc: str, pid: str) -> None:
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            return
        for tid in tids:
            try:
                st = os.stat(f"{proc}/{pid}/task/{tid}/ns/net")
            except OSError as exc:
                # PID 1 (the host's init, or a more privileged supervisor's) is never an allocation's task
                if exc.errno in _DENIED and pid != "1":
                    self.blind_threads.append(int(pid))
                continue
            self.inside.setdefault((st.st_dev, st.st_ino), int(pid))

    def _descriptors(self, proc: str, pid: str) -> None:
        """A descriptor of a namespace reads as `net:[N]` when it was opened through /proc, and as the path
        it was opened at (in the opener's view) when through a mount of it: those are looked at (their
        device must be nsfs's)."""
        where = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(where)
        except OSError as exc:
            if exc.errno in _DENIED:
                self.blind_fds.append(int(pid))
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

    def _mounts(self, proc: str, pid: str, seen: set[int]) -> None:
        """The nsfs mounts of the mount namespace `pid` is in (each namespace read once)."""
        try:
            mnt = os.stat(f"{proc}/{pid}/ns/mnt").st_ino
        except OSError:
            mnt = None
        if mnt is not None and mnt in seen:
            return
        try:
            with open(f"{proc}/{pid}/mountinfo", "rb") as f:
                lines = f.read().split(b"\n")
        except OSError:
            return
        if mnt is not None:
            seen.add(mnt)
        for line in lines:
            fields = line.split(b" ")
            if len(fields) > 4 and fields[3].startswith(b"net:[") and fields[3].endswith(b"]"):
                ino = fields[3][5:-1]
                if ino.isdigit():
                    self.mounts.setdefault(int(ino), set()).add(fields[4])

    def process_in(self, ns: Ident) -> int | None:
        return self.inside.get(ns)

    def unseen(self) -> str | None:
        """Why a process in a namespace may have gone unseen (None: every thread was looked at)."""
        if self.blind_threads:
            return f"the namespaces of process {self.blind_threads[0]} cannot be looked at from here"
        return None

    def held_otherwise(self, ns: Ident, path: str) -> str | None:
        """Why the namespace would outlive the removal of its mount at `path` (None: nothing else holds it
        that can be seen). A mount of it at the same path in another mount namespace goes with the unlink
        (the kernel detaches every mount on a file that is unlinked); one at another path keeps it."""
        if ns in self.fds:
            return f"process {self.fds[ns]} holds a descriptor of it"
        if self.blind_fds:
            return f"the descriptors of process {self.blind_fds[0]} cannot be looked at from here"
        here = {os.fsencode(path), os.fsencode(os.path.realpath(path))}
        others = self.mounts.get(ns[1], set()) - here
        if others:
            return f"it is mounted at {sorted(others)[0].decode(errors='replace')} too"
        return None


def remove(path: str) -> str | None:
    """Unmount the namespace at `path` (detached) and remove the file, as `ip netns delete` does; None when
    done, else why not, in words."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # not a mount point (a path Nomad no longer mounts): the file alone goes
            return f"cannot unmount {path}: {os.strerror(err)}"
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"cannot remove {path}: {exc.strerror} (run the sweep in the host's mount namespace, as root)"
    return None
