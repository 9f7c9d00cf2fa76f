"""host-local IPAM reservations: `<dataDir>/<network>/<ip>` holding `<containerID>\\r\\n<ifname>` (older
plugins: just the container ID), guarded by host-local's own flock on `<dataDir>/<network>/lock`.

Every access goes through directory fds with O_NOFOLLOW; a reservation is removed only while holding
host-local's lock and only when its content names the container being cleaned.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from contextlib import ExitStack, contextmanager

from cni_reaper.errors import TRY_AGAIN_LATER, CniError
from cni_reaper.state.locking import flock_within

LOCK_NAME = "lock"
MAX_CONTENT = 4096


def _open_dir(path: str, dir_fd: int | None = None) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None


class NetworkDir:
    """One network's reservation directory, opened once."""

    def __init__(self, data_dir: str, network: str) -> None:
        self.network = network
        self.fd: int | None = None
        root = _open_dir(data_dir)
        if root is not None:
            try:
                self.fd = _open_dir(network, dir_fd=root)
            finally:
                os.close(root)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @contextmanager
    def locked(self, timeout: float):
        """Hold host-local's lock for this network (nothing to hold when the directory does not exist)."""
        if self.fd is None:
            yield self
            return
        try:
            lfd = os.open(LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        except OSError as exc:
            raise CniError(TRY_AGAIN_LATER,
                           f"cannot open host-local lock of network {self.network}: {exc.strerror}") from None
        try:
            if not flock_within(lfd, timeout):
                raise CniError(TRY_AGAIN_LATER, f"host-local's lock of network {self.network} is held",
                               f"waited {timeout:g}s; retry")
            yield self
        finally:
            os.close(lfd)

    def owner(self, ip: str) -> tuple[str, str] | None:
        """(containerID, ifname) that reserved `ip`, or None when not reserved (or not a plain file)."""
        if self.fd is None:
            return None
        try:
            fd = os.open(ip, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            content = os.read(fd, MAX_CONTENT).decode(errors="replace")
        finally:
            os.close(fd)
        lines = content.replace("\r\n", "\n").split("\n")
        return lines[0].strip(), (lines[1].strip() if len(lines) > 1 else "")

    def reservations(self) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        if self.fd is None:
            return out
        for name in os.listdir(self.fd):
            try:
                ipaddress.ip_address(name)
            except ValueError:
                continue
            who = self.owner(name)
            if who is not None:
                out[name] = who
        return out

    def would_release(self, ip: str, container_id: str, ifname: str) -> bool:
        who = self.owner(ip)  # an empty ifname (an orphan known only by its tags) matches any
        return who is not None and who[0] == container_id and (not who[1] or not ifname or who[1] == ifname)

    def release(self, ip: str, container_id: str, ifname: str) -> bool:
        """Remove the reservation of `ip` if it names this container (and ifname, where recorded)."""
        if not self.would_release(ip, container_id, ifname):
            return False
        try:
            os.unlink(ip, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True


@contextmanager
def locked_networks(data_dir: str, networks: list[str], timeout: float):
    """Open and lock several networks' directories, always in name order (one lock order for everyone)."""
    with ExitStack() as stack:
        dirs: dict[str, NetworkDir] = {}
        for name in sorted(set(networks)):
            d = NetworkDir(data_dir, name)
            stack.callback(d.close)
            stack.enter_context(d.locked(timeout))
            dirs[name] = d
        yield dirs


def all_network_names(data_dir: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, n)))
    except OSError:
        return []
