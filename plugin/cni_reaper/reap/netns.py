"""Probe a network namespace by its path without entering, opening or creating it.

A live netns path (`/var/run/netns/<name>`, Docker's `/var/run/docker/netns/<id>`, `/proc/<pid>/ns/net`)
resolves to a file on nsfs; its inode is the namespace's ID. After `ip netns delete` the path is gone;
after a bare unmount it is an empty regular file on another file system. Neither is a live namespace.
"""

from __future__ import annotations

import os


class Identity(tuple):
    """(dev, ino) of a namespace's nsfs file."""

    __slots__ = ()

    def __new__(cls, dev: int, ino: int) -> Identity:
        return tuple.__new__(cls, (dev, ino))

    @property
    def dev(self) -> int:
        return self[0]

    @property
    def ino(self) -> int:
        return self[1]


_NSFS: list = []


def nsfs_dev() -> int | None:
    """The device of the nsfs file system every live namespace's file is on (read once per process)."""
    if not _NSFS:
        try:
            _NSFS.append(os.stat("/proc/self/ns/net").st_dev)
        except OSError:
            _NSFS.append(None)
    return _NSFS[0]


def identity(path: str | None) -> Identity | None:
    """Identity of the namespace at `path`, or None when no namespace is there (gone, unmounted, not nsfs)."""
    if not path:
        return None
    try:
        st = os.stat(path)  # stat only: never open() a netns path, never O_CREAT it
    except (OSError, ValueError):
        return None
    nsfs = nsfs_dev()
    if nsfs is None or st.st_dev != nsfs:
        return None
    return Identity(st.st_dev, st.st_ino)


def is_alive(path: str | None, recorded: tuple[int, int] | None) -> bool:
    """True while `path` still holds the namespace recorded (or any namespace, when none was recorded)."""
    now = identity(path)
    if now is None:
        return False
    return recorded is None or tuple(now) == tuple(recorded)
