"""Whether a host-local reservation is a dead life's own, pure: judged by what the reservation says (its
network, address, container and ifname) and by when host-local made it, never by the file's other identity.

host-local makes each reservation file once (O_EXCL) and never rewrites it, and gives no second address of a
range to a container and ifname that hold one ("duplicate allocation is not allowed"). An administrator's
chmod, a hard link, a `cp -a` restore and undo's rewrite change the file's inode or change time; none changes
what it says or its modification time (undo sets it back). A newer life of the same container and ifname that
was given the same address again (after its reservation was released) has a file made later: another
modification time. So a file is the dead life's own when it names the life's container and ifname and
- it is the very file recorded (device aside: inode, modification and change time), or
- its modification time is the one recorded (the same reservation, whatever became of the inode); or
- for a life that recorded none (cni-reaper 0.2, libcni's cache, GC's word): it was made no later than
  `not_after` (None: any time; the runtime's own word). A time that is ahead of now (libcni's cache entry
  written while the clock ran ahead, before a boot) bounds nothing: no file is taken as its own on it
  (`bound`: NONE_BY_TIME), a re-ADD in flight may have made it since.
"""

from __future__ import annotations

NONE_BY_TIME = -1  # `not_after` that no file's time meets: none is taken as the life's own by its time


def bound(made_at: int, now: int) -> int:
    """The `not_after` a dead life's own time gives (ns): that time, unless it is ahead of `now`."""
    return made_at if made_at <= now else NONE_BY_TIME


def names(owner: tuple[str, str], said: tuple[str, str]) -> bool:
    """Whether a reservation saying `said` (container, ifname; "" when it names none) names `owner` ("" ifname:
    any)."""
    cid, ifname = owner
    return said[0] == cid and not (ifname and said[1] and said[1] != ifname)


def own(owner: tuple[str, str], ident: tuple[int, int, int] | None, not_after: int | None,
        said: tuple[str, str], found: tuple[int, int, int]) -> bool:
    """Whether the reservation found (`said`: whom it names; `found`: inode, modification and change time, ns)
    is the dead life's own, which expects `owner` and recorded `ident` (or, with none, a file made no later than
    `not_after`)."""
    if ident is not None and found == ident:
        return True
    if not names(owner, said):
        return False
    if ident is not None:
        return found[1] == ident[1]
    return not_after is None or found[1] <= not_after
