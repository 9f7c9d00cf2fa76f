"""host-local IPAM's reservations: `<dataDir>/<network>/<ip>` holding `<containerID>\\r\\n<ifname>` (older
plugins: just the container ID), created once with O_EXCL and never rewritten, guarded by host-local's flock
on `<dataDir>/<network>/lock` (held only while it allocates or releases).

Directories are reached the way host-local reaches them (symlinks followed, as Go's os.Open does); the
reservation files themselves are opened with O_NOFOLLOW. Two configured paths that reach one directory are
one directory (judged by device and inode), locked once. A reservation is removed only while holding
host-local's lock, and only when it is the very file the claims (claims.py) say is the dead life's own.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from cni_reaper.reap.probes import OnLink

from cni_reaper.errors import TRY_AGAIN_LATER, CniError
from cni_reaper.files import flock_within, holding
from cni_reaper.reap import probes

LOCK_NAME = "lock"


class Reservation:
    __slots__ = ("content", "data_dir", "ident", "ip", "mode", "network", "owner")

    def __init__(self, data_dir: str, network: str, ip: str, owner: tuple[str, str], ident: tuple[int, int, int],
                 content: str = "", mode: int = 0o600) -> None:
        self.data_dir, self.network, self.ip, self.owner, self.ident = data_dir, network, ip, owner, ident
        self.content, self.mode = content, mode

    def __repr__(self) -> str:
        return f"{self.data_dir}/{self.network}/{self.ip} ({self.owner[0]} {self.owner[1]})"


class Keeping:
    """Where host-local keeps one network's addresses (`data_dir`, "" not known) and the subnets it gives them
    from (`subnets`, CIDR strings), as its current conflist says or an ADD's own reserved address shows: only an
    address inside them can be taken for that network's when nothing else names its network."""

    __slots__ = ("data_dir", "subnets")

    def __init__(self, data_dir: str = "", subnets: Iterable[str] = ()) -> None:
        self.data_dir, self.subnets = data_dir, tuple(subnets)

    def __repr__(self) -> str:
        return f"Keeping({self.data_dir!r}, {self.subnets!r})"

    def covers(self, addresses: Iterable[str], links: list[OnLink] | None = None) -> bool:
        """Whether every one of `addresses` (at least one) lies in one of the subnets, and (with `links`, the
        host's: probes.on_link) on one interface alone, whose network is the narrowest of those subnets that
        holds it: no interface has a narrower network holding it (another network inside this one), no
        other has one as narrow, and no other bridge has any (a network around this one)."""
        import ipaddress

        try:
            ips = [ipaddress.ip_address(a) for a in addresses]
        except ValueError:
            return False
        nets = self._networks()
        for ip in ips:
            holding = [n.prefixlen for n in nets if n.version == ip.version and ip in n]
            if not holding or (links is not None and not _alone_on(ip, max(holding), links)):
                return False
        return bool(ips)

    def _networks(self) -> list[Any]:
        import ipaddress

        nets = []
        for s in self.subnets:
            try:
                nets.append(ipaddress.ip_network(s, strict=False))
            except ValueError:
                continue
        return nets


def _alone_on(ip: Any, prefix: int, links: list[OnLink]) -> bool:
    """Whether `ip` is on one interface alone, on a network of `prefix` (Keeping.covers)."""
    on = [link for link in links if link.network.version == ip.version and ip in link.network
          and (link.bridge or link.network.prefixlen >= prefix)]
    return len({link.index for link in on}) == 1 and all(link.network.prefixlen == prefix for link in on)


class NetworkDir:
    """One network's reservation directory, opened once (None `fd`: there is none)."""

    def __init__(self, data_dir: str, network: str) -> None:
        self.data_dir, self.network = data_dir, network
        self.fd = probes.open_network_dir(data_dir, network)
        self.ident: tuple[int, int] | None = None
        self.unread: list[str] = []  # the reservations all() found but could not read (then it is not complete)
        self._lock: int | None = None
        # the device of a file in it (its lock, once held): on overlayfs a file reports its layer's device, not
        # the directory's, and a reservation's recorded device is its file's
        self.file_dev: int | None = None
        if self.fd is not None:
            st = os.fstat(self.fd)
            self.ident = (st.st_dev, st.st_ino)

    def close(self) -> None:
        """Let go of host-local's lock (if held) and of the directory."""
        self.unlock()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def lock(self, timeout: float) -> None:
        """Hold host-local's lock for this network until close() (nothing to hold when the directory does not
        exist). CniError (11) when it cannot be had within `timeout`."""
        if self.fd is None or self._lock is not None:
            return
        try:  # never blocking (a FIFO at the name would hold the open itself), and only a regular file
            lfd = os.open(LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600,
                          dir_fd=self.fd)
            if not stat.S_ISREG(os.fstat(lfd).st_mode):
                os.close(lfd)
                raise OSError(errno.EINVAL, "not a regular file")
        except OSError as exc:
            raise CniError(TRY_AGAIN_LATER, f"cannot open host-local's lock of {self.data_dir}/{self.network}: "
                           f"{exc.strerror}", "host-local cannot use that network either: remove what is at "
                           f"{self.data_dir}/{self.network}/{LOCK_NAME}") from None
        if not flock_within(lfd, timeout):
            os.close(lfd)
            raise CniError(TRY_AGAIN_LATER, f"host-local's lock of {self.data_dir}/{self.network} is held",
                           f"waited {timeout:g}s; retry")
        self._lock = lfd
        self.file_dev = os.fstat(lfd).st_dev

    def unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the fd releases the flock
            self._lock = None

    def locked(self, timeout: float) -> _Held:
        """Hold host-local's lock for this network (a context manager; the directory stays open after)."""
        return _Held(self, timeout)

    def get(self, ip: str) -> Reservation | None:
        """The reservation of `ip`, or None: there is none, or it cannot be read (then it is named in `unread`)."""
        if self.fd is None:
            return None
        found = probes.read_reservation(self.fd, ip)
        if found is None:
            try:
                os.stat(ip, dir_fd=self.fd, follow_symlinks=False)
                self.unread.append(ip)  # there, but not a file that can be read: it may name anyone
            except OSError:
                pass
            return None
        return Reservation(self.data_dir, self.network, ip, found.owner, (found.ino, found.mtime, found.ctime),
                           found.content, found.mode)

    def all(self) -> list[Reservation]:
        """Every reservation (files named by an address); those that cannot be read are named in `unread`."""
        if self.fd is None:
            return []
        out = []
        self.unread = []
        for name in sorted(os.listdir(self.fd)):  # OSError: nothing of it is known (the clean-up fails)
            if (":" in name or name[:1].isdigit()) and _is_address(name):
                r = self.get(name)
                if r is not None:
                    out.append(r)
        return out

    def release(self, r: Reservation) -> bool:
        """Remove reservation `r` if the file is still the one that was read (same inode and times)."""
        now = self.get(r.ip)
        if self.fd is None or now is None or now.ident != r.ident or now.owner != r.owner:
            return False
        try:
            os.unlink(r.ip, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True


def _is_address(name: str) -> bool:
    from cni_reaper.cni.ipaddr import parse_ip

    try:
        parse_ip(name)
        return True
    except ValueError:
        return False


def holds_any(data_dir: str) -> bool:
    """Whether host-local holds any address in any network under data_dir."""
    for n in networks_in(data_dir):
        try:
            names = os.listdir(os.path.join(data_dir, n))
        except OSError:
            continue
        if any((":" in name or name[:1].isdigit()) and _is_address(name) for name in names):
            return True
    return False


def reserved_elsewhere(data_dirs: list[str], cid: str, network: str) -> bool:
    """Whether a reservation names container `cid` in another network than `network`, in any of `data_dirs`
    (a directory that cannot be read whole may: True)."""
    for data_dir in dict.fromkeys(data_dirs):
        for n in networks_in(data_dir):
            if n == network:
                continue
            d = NetworkDir(data_dir, n)
            try:
                if any(r.owner[0] == cid for r in d.all()) or d.unread:
                    return True
            except OSError:
                return True
            finally:
                d.close()
    return False


def networks_in(data_dir: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, n)))
    except OSError:
        return []


class _Held:
    """NetworkDir.locked's context manager (classes, not contextlib: its imports cost a clean-up milliseconds)."""

    def __init__(self, d: NetworkDir, timeout: float) -> None:
        self.d, self.timeout = d, timeout
        self.took = False

    def __enter__(self) -> NetworkDir:
        self.took = self.d._lock is None  # held already (an outer holder): not ours to let go
        self.d.lock(self.timeout)
        return self.d

    def __exit__(self, *exc: object) -> None:
        if self.took:
            self.d.unlock()


class locked_dirs:  # lower case: used as a function, `with locked_dirs(pairs, timeout) as dirs`
    """Open and lock the (dataDir, network) directories, in one order for everyone (by the data dir's real path,
    then network); a directory reached by two paths is locked once and answers for both. All are let go (in
    the reverse order) on the way out, and those already held when one cannot be had."""

    def __init__(self, pairs: Iterable[tuple[str, str]], timeout: float, wait: float | None = None) -> None:
        self.pairs, self.timeout = set(pairs), timeout
        self.wait = timeout if wait is None else min(wait, timeout)  # each lock waited for (then CniError 11)
        self.held: list[NetworkDir] = []
        self.hold = holding(timeout, "host-local's locks")  # every allocation of the networks waits for them

    def __enter__(self) -> dict[tuple[str, str], NetworkDir]:
        out: dict[tuple[str, str], NetworkDir] = {}
        seen: dict[tuple[int, int], NetworkDir] = {}
        try:
            for data_dir, network in sorted(self.pairs, key=lambda p: (os.path.realpath(p[0]), p[1])):
                d = NetworkDir(data_dir, network)
                if d.ident is not None and d.ident in seen:
                    d.close()
                    out[(data_dir, network)] = seen[d.ident]
                    continue
                self.held.append(d)
                d.lock(self.wait)
                if d.ident is not None:
                    seen[d.ident] = d
                out[(data_dir, network)] = d
        except BaseException:
            self.__exit__()
            raise
        self.hold.__enter__()
        return out

    def __exit__(self, *exc: object) -> None:
        self.hold.__exit__()
        while self.held:
            self.held.pop().close()
