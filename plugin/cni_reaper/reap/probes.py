"""Observations of the host, made with a few syscalls and never judged here (the judgement is judge/'s, the
looks it asks for evidence.py's); verbs/ and tools/ reach reap/ through this module and reap/engine.py alone:

- the host: the boot (`/proc/sys/kernel/random/boot_id`), the machine (`/etc/machine-id`), the network
  namespace this process runs in and the nsfs device (`/proc/self/ns/net`); all None when /proc is not there;
- a namespace behind a path: device, inode and, for a bind-mounted nsfs file (a pinned inode: Nomad's
  `/var/run/netns/<alloc>`, Docker's `/var/run/docker/netns/<id>`, iproute2's), its change time. The kernel
  recycles nsfs inode numbers (a namespace made again at the same path a second later often gets the same
  one), but a pinned nsfs inode keeps the change time it was made with for as long as it is mounted, so
  (device, inode, change time) names one life. A path that is a symlink (`/proc/<pid>/ns/net`) reaches an
  inode that the kernel makes anew on every look: its change time means nothing and is not kept;
- the directory a netns path is in (device, inode): a view that shows another directory there (a tmpfs over
  /var/run/netns, a private /run) is not the view the namespace was recorded in;
- a link in this network namespace by name (its index): the host side of a veth pair lives here and dies
  with the container's namespace, whatever mount namespace looks;
- a host-local reservation file: who it names, and its identity (inode, modification and change time).

The netns path itself is only ever stat()ed: never opened, entered or created.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any

from cni_reaper.state.record import DirId, HostId, Life, NetnsId, ReservationId, Veth

BOOT_ID = "/proc/sys/kernel/random/boot_id"
MACHINE_ID = "/etc/machine-id"
SELF_NETNS = "/proc/self/ns/net"
SELF_MNTNS = "/proc/self/ns/mnt"
INIT_MNTNS = "/proc/1/ns/mnt"
RESERVATION_MAX = 4096


class Host:
    """What this process runs on and in, read once per process."""

    __slots__ = ("boot", "machine", "mnt", "netns", "nsfs", "problem")

    def __init__(self) -> None:
        self.boot = _boot()
        self.machine = _read_line(MACHINE_ID) or ""
        self.problem = ""
        self.mnt = _ino(SELF_MNTNS)
        try:
            st = os.stat(SELF_NETNS)
            self.netns: int | None = st.st_ino
            self.nsfs: int | None = st.st_dev
        except OSError as exc:
            self.netns = self.nsfs = None
            self.problem = f"/proc is not mounted here ({SELF_NETNS}: {exc.strerror})"
        if self.boot is None and not self.problem:
            self.problem = f"{BOOT_ID} cannot be read"

    def as_record(self) -> HostId | None:
        if self.boot is None or self.netns is None or self.mnt is None:
            return None
        return HostId(self.boot, self.machine, self.netns, self.mnt)


BOUND = "@bound"  # the boot ID read from a file mounted over /proc's (a container's own, as systemd-nspawn gives)


def _boot() -> str | None:
    """The boot ID and the view it was read in: as /proc has it, or (BOUND) from a file mounted over it. Two
    processes of one host may read different IDs by view alone: systemd-nspawn mounts a container's own ID
    over /proc's, and a unit with ProtectKernelTunables= remounts /proc/sys and reads the host's."""
    value = _read_line(BOOT_ID)
    if value is None:
        return None
    try:
        bound = os.stat(BOOT_ID).st_dev != os.stat(os.path.dirname(BOOT_ID)).st_dev
    except OSError:
        bound = False
    return value + BOUND if bound else value


def same_boot(recorded: str, now: str) -> bool | None:
    """Whether a boot ID recorded and one read now name the same boot; None when they were read in different
    views (one from /proc, one from a file over it): then they say nothing, and no life is judged by them."""
    if recorded.endswith(BOUND) != now.endswith(BOUND):
        return None
    return recorded == now


def _ino(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def init_mnt() -> int | None:
    """The mount namespace of PID 1 (where a runtime run by the init system usually is)."""
    return _ino(INIT_MNTNS)


def _read_line(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip() or None
    except OSError:
        return None
    finally:
        os.close(fd)


_HOST: list[Host] = []


def host() -> Host:
    if not _HOST:
        _HOST.append(Host())
    return _HOST[0]


class OnLink:
    """A network a host interface is on (one of its addresses with its prefix): the interface's index, whether
    it is a bridge, and the network (an ipaddress network)."""

    __slots__ = ("bridge", "index", "network")

    def __init__(self, index: int, bridge: bool, network: Any) -> None:
        self.index, self.bridge, self.network = index, bridge, network

    def __repr__(self) -> str:
        return f"OnLink({self.index}, {'bridge' if self.bridge else 'link'}, {self.network})"


def on_link() -> list[OnLink] | None:
    """The networks of every address of this network namespace's interfaces (netlink, two dumps); None when
    they cannot be read."""
    import ipaddress
    import socket

    from cni_reaper.reap.rtnetlink import bridges_and_addresses

    try:
        bridges, addresses = bridges_and_addresses()
        return [OnLink(index, index in bridges,
                       ipaddress.ip_network(f"{socket.inet_ntop(family, raw)}/{prefix}", strict=False))
                for index, family, raw, prefix in addresses]
    except Exception:  # noqa: BLE001 - netlink refused or a library fault: nothing is known
        return None


class Unseen(Exception):
    """A path could not be looked at (EACCES, EIO, ELOOP, ...): nothing is known of what is there. Absence
    is never assumed from a look that failed: only "no such file" (ENOENT, ENOTDIR) says nothing is there."""

    def __init__(self, path: str, exc: OSError) -> None:
        super().__init__(f"{path} cannot be looked at ({exc.strerror or type(exc).__name__})")


NOTHING_THERE = (errno.ENOENT, errno.ENOTDIR)


def netns_id(path: str | None) -> NetnsId | None:
    """The identity of the namespace at `path`, or None when no namespace is there (gone,
    unmounted, not nsfs). ctime is None where it does not name one life (the path is a symlink). Raises
    Unseen when the path cannot be looked at: a failed look is no absence."""
    if not path:
        return None
    nsfs = host().nsfs
    try:
        st = os.stat(path)  # stat only: never open() a netns path, never O_CREAT it
        pinned = not stat.S_ISLNK(os.lstat(path).st_mode)
    except ValueError:
        return None
    except OSError as exc:
        if exc.errno in NOTHING_THERE:
            return None
        raise Unseen(path, exc) from None
    if nsfs is None or st.st_dev != nsfs:
        return None
    return NetnsId(st.st_dev, st.st_ino, st.st_ctime_ns if pinned else None)


def holding_group(names: list[str], dirs: list[tuple[str, int]], bases: list[str], ints: str, digest: int) -> list[str]:
    """Of a group of the index's first part (index.QuickGroup), the names whose path holds the very namespace
    recorded now: the names, their netns paths as runs of one directory (`dirs`: (directory, how many)) and
    the names in it (`bases`; index.split_paths), and the (dev, ino, ctime) triples recorded (decimals joined
    by commas) with their digest (index.digest). Each path is looked at with one `stat` relative to its
    directory, opened once (O_PATH: the path's own walk, symlinks on the way followed as lstat follows
    them; the last component never followed): a busy client's thousand paths are not walked from the root a
    thousand times. What is seen is compared by its digest first (a group all alive, a thousand stats and
    one hash); when it differs, one by one."""
    stat = os.stat
    seen: list[Any] = []
    add = seen.extend
    at = 0
    for where, count in dirs:
        try:
            fd = os.open(where, _DIR_FLAGS)
        except (OSError, ValueError, TypeError):
            add(_UNSEEN * count)
            at += count
            continue
        try:
            for base in bases[at:at + count]:
                try:
                    st = stat(base, dir_fd=fd, follow_symlinks=False)
                except (OSError, ValueError, TypeError):
                    add(_UNSEEN)
                    continue
                add((st.st_dev, st.st_ino, st.st_ctime_ns))
        finally:
            os.close(fd)
        at += count
    if hash(tuple(seen)) == digest:
        return names
    try:
        want = [int(x) for x in ints.split(",")] if ints else []
    except ValueError:  # not as written: judged in full
        return []
    if len(want) != len(seen):
        return []
    return [n for k, n in enumerate(names) if seen[3 * k:3 * k + 3] == want[3 * k:3 * k + 3]]


_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_UNSEEN = (None, None, None)


def holding_flat(names: list[str], paths: list[str], ints: list[int]) -> list[str]:
    """Of the names, their netns paths and (dev, ino, ctime) of each one's namespace one after another
    (index.QuickSaved), the names whose path holds that very namespace now, seen with one lstat each (a path
    that is a symlink, or holds something else, is not listed: netns_id says what is there). The identity is
    an nsfs one: no symlink has it. A batch: a sweep looks at every live attachment of the node on every call."""
    lstat = os.lstat
    out = []
    for name, path, dev, ino, ctime in zip(names, paths, ints[0::3], ints[1::3], ints[2::3]):
        try:
            st = lstat(path)
        except (OSError, ValueError, TypeError):
            continue
        if st.st_ino == ino and st.st_dev == dev and st.st_ctime_ns == ctime:
            out.append(name)
    return out


def dir_id(path: str) -> DirId | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return DirId(st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def netns_dir(path: str) -> str:
    """The directory whose identity says whether this process sees a netns path as the runtime did: the
    path's directory, or /proc itself for a /proc/<pid>/ns/net path (whose directory lives and dies with its
    process)."""
    if path.startswith("/proc/"):
        return "/proc"
    return os.path.dirname(path.rstrip("/")) or "/"


SENDS = (b"shared",)  # a mount made on a member of a peer group propagates to every member and slave of it
RECEIVES = (b"shared", b"master")  # a mount receives what its own peer group, and the group it is a slave of, get


def _mountinfo(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _entry(data: bytes, target: str, exact: bool = False) -> list[bytes] | None:
    """The optional fields of the mount `target` is on (the longest covering mount point; the last of equals
    is on top), or with `exact` of a mount at `target` itself (None when there is none)."""
    best, found = -1, None
    for line in data.split(b"\n"):
        fields = line.split(b" ")
        if len(fields) < 7:
            continue
        point = fields[4].decode(errors="replace").replace("\\040", " ")
        inside = target == point or (not exact and target.startswith(point.rstrip("/") + "/"))
        if inside and len(point) >= best:
            best, found = len(point), fields[6:]
    return found


def mount_groups(directory: str, mountinfo: str = "/proc/self/mountinfo",
                 kinds: tuple[bytes, ...] = RECEIVES) -> list[int] | None:
    """The peer groups of the mount that `directory` is on, as the process whose mountinfo it is sees it:
    with SENDS, the group it is a member of (`shared:N`): a namespace mounted there reaches every member and
    slave of N; with RECEIVES, also the group it is a slave of (`master:N`): it sees what is mounted in N. A
    slave's master is never sent to: mounts made in a slave do not propagate up. [] for a private mount; None
    when mountinfo cannot be read."""
    data = _mountinfo(mountinfo)
    if data is None:
        return None
    return _tags(_entry(data, os.path.realpath(directory)) or [], kinds)


def sending_groups(directory: str, netns_path: str, mountinfo: str = "/proc/self/mountinfo") -> list[int]:
    """The peer groups whose members and slaves see the namespace mounted at `netns_path` (in `directory`) as
    this process sees it: the group `directory`'s mount is a member of; and when the namespace's own mount
    is a copy propagated from upstream (it has a master: it was mounted in the group `directory`'s mount is
    a slave of, or above), that group too. [] when it was mounted here and propagates nowhere."""
    data = _mountinfo(mountinfo)
    if data is None:
        return []
    where = _entry(data, os.path.realpath(directory)) or []
    groups = _tags(where, SENDS)
    own = _entry(data, os.path.realpath(netns_path), exact=True)
    if own is not None and _tags(own, (b"master",)):
        groups += [g for g in _tags(where, (b"master",)) if g not in groups]
    return groups


def _tags(optional: list[bytes], kinds: tuple[bytes, ...]) -> list[int]:
    out = []
    for field in optional:
        if field == b"-":
            break
        name, _, n = field.partition(b":")
        if name in kinds and n.isdigit():
            out.append(int(n))
    return out


def link_index(name: str) -> int | None:
    """The index of the link `name` in this network namespace, or None when there is none. Raises Unseen when
    the look failed: CPython's if_nametoindex says "no interface" for every failure (glibc's 0 when it cannot
    even open its socket: too many open files, ENOMEM), so a miss is asked again of if_nameindex, which
    lists the links or raises with the reason."""
    import _socket

    try:
        return _socket.if_nametoindex(name)
    except ValueError:
        return None
    except OSError:
        pass
    try:
        listed = _socket.if_nameindex()
    except OSError as exc:
        raise Unseen(f"the links of this namespace ({name})", exc) from None
    return next((index for index, n in listed if n == name), None)


def veth_gone(name: str) -> bool:
    """Whether no link `name` is in this network namespace (a link that cannot be looked at is not gone)."""
    try:
        return link_index(name) is None
    except Unseen:
        return False


def observe_life(netns_path: str, host_veths: list[str]) -> Life:
    """What an ADD records to tell this life from every other later (docs/how-it-works.md, "Evidence"), as a
    life without addresses or ports yet (record.life adds them)."""
    h = host()
    veth = None
    for name in host_veths:
        try:
            index = link_index(name)
        except Unseen:
            continue
        if index is not None:
            veth = Veth(name, index)
            break
    directory = None
    if netns_path:
        where = netns_dir(netns_path)
        directory = dir_id(where)
        if directory is not None:
            directory.groups = tuple(sending_groups(where, netns_path))
    try:
        ident = netns_id(netns_path)
    except Unseen:
        ident = None  # recorded without an identity: judged by its path and veth alone, as a 0.2 record is
    return Life(netns_path, ident, directory, h.as_record(), veth, (), (), "")


def maybe_there(path: str | None) -> bool:
    """Whether a namespace is, or may be, at `path` (one that cannot be looked at may be there)."""
    try:
        return netns_id(path) is not None
    except Unseen:
        return True


# -- host-local's reservations --------------------------------------------------------------------
class ReservationFile:
    """A host-local reservation file as read: who it names ((containerID, ifname); ifname "" in the old format),
    its identity (device, inode, modification and change times in ns), its content and permission bits."""

    __slots__ = ("content", "ctime", "dev", "ino", "mode", "mtime", "owner")

    def __init__(self, owner: tuple[str, str], st: os.stat_result, content: str) -> None:
        self.owner, self.content, self.mode = owner, content, st.st_mode & 0o777
        self.dev, self.ino, self.mtime, self.ctime = st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def read_reservation(dir_fd: int, ip: str) -> ReservationFile | None:
    """The reservation file of `ip` in an open network directory, or None when there is none (or it is not a
    plain file)."""
    try:
        fd = os.open(ip, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        content = os.read(fd, RESERVATION_MAX).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = content.replace("\r\n", "\n").split("\n")
    return ReservationFile((lines[0].strip(), lines[1].strip() if len(lines) > 1 else ""), st, content)


def open_network_dir(data_dir: str, network: str) -> int | None:
    """host-local's directory of `network` under `data_dir`, opened the way host-local reaches it (symlinks
    followed, as Go's os.Open does), or None when there is none."""
    try:
        return os.open(os.path.join(data_dir, network), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None


def find_reservation(data_dirs: list[str], network: str, ip: str, container_id: str,
                     ifname: str) -> ReservationId | None:
    """Where host-local reserved `ip` for this attachment: the first of `data_dirs` whose reservation file names
    it, and that file's identity; None: another IPAM, or a directory not known."""
    for data_dir in data_dirs:
        fd = open_network_dir(data_dir, network)
        if fd is None:
            continue
        try:
            found = read_reservation(fd, ip)
        finally:
            os.close(fd)
        if found is not None and found.owner[0] == container_id and found.owner[1] in ("", ifname):
            return ReservationId(data_dir, found.dev, found.ino, found.mtime, found.ctime)
    return None


# -- what the operator's commands read of the host (doctor, list), changing nothing ------------------------
# which iptables each family uses, the native nftables tables present, the CNI chains stranded in the other
# flavour, libcni's cache and host-local's directories as a runtime would find them, the host ports mapped
# twice. Their modules are imported when asked for: the verbs load none of them.
def iptables_of(backend: str, family: int) -> tuple[str | None, str]:
    """The iptables flavour the `backend` setting gives `family` here, or None and why (flavour.detect)."""
    from cni_reaper.reap.netfilter.flavour import detect

    return detect(backend, family=family)


def iptables_tool(family: int) -> str:
    """The iptables command of `family` (iptables, ip6tables)."""
    from cni_reaper.reap.netfilter.flavour import tool

    return tool(family)


def tools_path() -> str:
    """The PATH the tools are looked for on when the process has none."""
    from cni_reaper.reap.netfilter.flavour import FALLBACK_PATH

    return FALLBACK_PATH


def cache_problem(cache_dir: str) -> str | None:
    """Why libcni's cache in `cache_dir` cannot be read (None: it can)."""
    from cni_reaper.reap.cache import view

    return view(cache_dir)


def cache_results_dir(cache_dir: str) -> str:
    """Where libcni makes its results directory under `cache_dir`."""
    from cni_reaper.reap.cache import results_dir

    return results_dir(cache_dir)


def nomad_rights() -> str:
    """What a Nomad token for `sweep --nomad` needs."""
    from cni_reaper.reap.scheduler import RIGHTS

    return RIGHTS


def native_tables() -> tuple[list[str] | None, str]:
    """The native tables of plugins 1.6+ present ("family name"), and why they could not be listed ("": they
    could); None: no nft binary here."""
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend
    from cni_reaper.reap.netfilter.nftables.rules import TABLES

    nft = NftBackend()
    if not nft.binary:
        return None, ""
    try:
        present = nft.tables()
    except BackendError as exc:
        return [], str(exc)
    return [f"{f} {n}" for f, n in TABLES if (f, n) in present], ""


def doubled_ports() -> dict[str, set[str]]:
    """The host ports (port/protocol) more than one container maps now, and those containers."""
    from cni_reaper.reap.holders import port_map

    return port_map().doubled()


def stranded_cni_chains(other: str, family: int) -> int:
    """How many CNI-* chains the nat table of the other flavour holds; 0 without running anything when that
    flavour has no nat table (no module is loaded, no table made)."""
    import subprocess

    from cni_reaper.reap.netfilter.flavour import tool, which

    binary = which(f"{tool(family)}-{other}-save")
    if binary is None or not _has_nat_table(other, family):
        return 0
    try:
        text = subprocess.run([binary, "-t", "nat"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in text.splitlines() if line.startswith(":CNI-"))


def _has_nat_table(flavour: str, family: int) -> bool:
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend

    if flavour == "legacy":
        names = "/proc/net/ip_tables_names" if family == 4 else "/proc/net/ip6_tables_names"
        try:
            with open(names) as f:
                return "nat" in f.read().split()
        except OSError:
            return False
    try:
        return ("ip" if family == 4 else "ip6", "nat") in NftBackend().tables()
    except BackendError:
        return False
