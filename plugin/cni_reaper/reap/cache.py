"""libcni's cache of attachments: `<cacheDir>/results/<network>-<containerID>-<ifname>`, one JSON file per
attachment (its netns path, CNI_ARGS, capability args and the chain's result), written once the whole ADD
succeeded and deleted once the whole DEL did. libcni hands the cached result to every plugin of a later DEL
as prevResult, and libcni 1.3's GC sends a DEL for every cached attachment the runtime no longer lists.

Read here as evidence (an entry that was there and is gone: the DEL is over; an entry whose netns is gone:
that attachment is dead), and, once cni-reaper has released a dead attachment's addresses, rewritten so
that nothing the runtime still holds for it hurts the addresses' next owner (docs/how-it-works.md, "The runtime's memory
of a dead attachment"): the released addresses are taken out of the cached result, everything else stays.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cni_reaper.state.names import Attached

from cni_reaper import jsonio
from cni_reaper.files import open_regular
from cni_reaper.judge.modes import strictest
from cni_reaper.state.names import attachment_name

MAX_ENTRY_BYTES = 1 << 20
RESULTS = "results"


def results_dir(cache_dir: str) -> str:
    return os.path.join(cache_dir, RESULTS)


def unrecorded(cache_dir: str, recorded: Callable[[], Attached], network: str) -> bool:
    """Whether libcni caches an attachment that has no record (one listing of the results directory;
    `recorded`: the records as libcni names them, asked only when something is cached): a cheap sign that an
    allocation cni-reaper never recorded may map a host port. A directory that cannot be listed says no (the
    look after the answer still runs). A name is read as its attachment's only where two networks known here
    (the records', `network`: this call's) could have made it ("nomad-a-b-eth0": network nomad-a's b, or
    nomad's a-b): then the entry itself says whose it is."""
    try:
        names = [n for n in os.listdir(results_dir(cache_dir)) if not n.startswith(".")]
    except OSError:
        return False
    if not names:
        return False
    known = recorded()
    prefixes = [f"{o}-" for o in {network, *known.networks}]
    for n in names:
        if n not in known.names:
            return True
        if len(prefixes) > 1 and sum(map(n.startswith, prefixes)) > 1 and not _holds(cache_dir, n, known):
            return True
    return False


def _holds(cache_dir: str, name: str, known: Attached) -> bool:
    """Whether the attachment cached as `name` (by what its entry says) has a record; an entry that cannot be
    read says no."""
    try:
        fd = os.open(results_dir(cache_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        e = _read(fd, name)
    finally:
        os.close(fd)
    return e is not None and known.holds(e.network, e.container_id, e.ifname)


def view(cache_dir: str) -> str | None:
    """Why the cache cannot be read as evidence (None when it can): its results directory is missing or
    unreadable. An empty one is readable: it says no attachment is cached. (Opened, not listed: a busy
    client's cache holds an entry per attachment, and every tombstone asks.)"""
    try:
        os.close(os.open(results_dir(cache_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    except FileNotFoundError:
        return f"libcni's cache {results_dir(cache_dir)} does not exist"
    except OSError as exc:
        return f"libcni's cache {results_dir(cache_dir)} cannot be read ({exc.strerror})"
    return None


def exists(cache_dir: str, network: str, container_id: str, ifname: str) -> bool | None:
    """Whether libcni caches this attachment; None when its cache cannot be seen."""
    path = os.path.join(results_dir(cache_dir), attachment_name(network, container_id, ifname))
    try:
        os.lstat(path)
        return True
    except FileNotFoundError:
        return None if view(cache_dir) else False
    except OSError:
        return None


class Cached:
    """One cached attachment, as far as cni-reaper reads it."""

    __slots__ = ("container_id", "doc", "ifname", "ips", "mtime", "name", "netns", "network", "text", "veths")

    def __init__(self, name: str, doc: dict[str, Any], mtime: int, text: str = "") -> None:
        self.name, self.doc, self.mtime, self.text = name, doc, mtime, text
        self.network = _str(doc.get("networkName"))
        self.container_id = _str(doc.get("containerId"))
        self.ifname = _str(doc.get("ifName"))
        result = result_of(doc)
        self.ips = sorted(set(_result_ips(result)))
        listed = result.get("interfaces")
        interfaces = [i for i in listed if isinstance(i, dict)] if isinstance(listed, list) else []
        self.veths = _host_veths(interfaces)
        self.netns = _netns_of(doc, interfaces)


def _netns_of(doc: dict[str, Any], interfaces: list[dict[str, Any]]) -> str:
    """The netns a cache entry names: its own key, its runtime config's, else its result's sandbox."""
    runtime = doc.get("runtimeConfig")
    named = _str(doc.get("netns")) or _str(runtime.get("netns") if isinstance(runtime, dict) else None)
    return named or next((s for s in (i.get("sandbox") for i in interfaces) if isinstance(s, str) and s), "")


def _host_veths(interfaces: list[dict[str, Any]]) -> list[str]:
    """The names of a result's host-side veths (interfaces without a sandbox)."""
    return [i["name"] for i in interfaces
            if isinstance(i.get("name"), str) and not i.get("sandbox") and i["name"].startswith("veth")]


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def result_of(doc: dict[str, Any]) -> dict[str, Any]:
    result = doc.get("result")
    if isinstance(result, str):
        try:
            result = jsonio.loads(result)
        except ValueError:
            return {}
    return result if isinstance(result, dict) else {}


def _result_ips(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    listed = result.get("ips")
    entries = list(listed) if isinstance(listed, list) else []
    entries += [result[k] for k in ("ip4", "ip6") if isinstance(result.get(k), dict)]
    for ip in entries:
        if isinstance(ip, dict):
            text = ip.get("address") or ip.get("ip")
            if isinstance(text, str) and "/" in text:
                out.append(text.split("/")[0])
    return out


def _read(dir_fd: int, name: str) -> Cached | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
            return None
        data = os.read(fd, st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = jsonio.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return Cached(name, doc, st.st_mtime_ns, data.decode("utf-8", "surrogateescape")) if isinstance(doc, dict) else None


def entries(cache_dir: str, network: str, container_id: str) -> list[Cached] | None:
    """The cached attachments of (network, container ID), any ifname, judged by their content (a name alone
    is ambiguous: IDs and ifnames may contain "-"); None when the cache cannot be read."""
    results = Results(cache_dir)
    return _entries_in(results, network, container_id) if results.names is not None else None


def _entries_in(results: Results, network: str, container_id: str) -> list[Cached]:
    """The cached attachments of (network, container ID) in one listed cache (entries())."""
    return [e for _, e in results.read(network, container_id) if e is not None and _of(e, network, container_id)]


def chained_modes(cache_dir: str, keys: list[tuple[str, str]], state_dir: str) -> tuple[dict[str, str], set[str]]:
    """What the conflists libcni cached with the attachments of (network, container ID) of `keys` say (libcni
    keeps the network's configuration in each entry), for attachments found with no record: (network -> the
    mode its cni-reaper entry gives it, the networks whose cached conflist chains no cni-reaper). The mode is
    observe when that entry keeps another state directory (its own cni-reaper judges it) or gives the mode
    twice; an entry that cannot be read says nothing."""
    modes: dict[str, str] = {}
    unchained: set[str] = set()
    results = Results(cache_dir)  # listed once for every key (an orphan sweep asks about thousands)
    if results.names is None:
        return modes, unchained
    for network, container_id in keys:
        for e in _entries_in(results, network, container_id):
            plugins = _cached_plugins(e.doc.get("config"))
            mode = _chained_mode(plugins, state_dir)
            if mode is not None:
                modes[network] = strictest(mode, modes.get(network))
            elif plugins:
                unchained.add(network)
    return modes, unchained


def _chained_mode(plugins: list[Any], state_dir: str) -> str | None:
    """The mode of the cni-reaper entries among a cached conflist's `plugins` (observe when any says it), None
    when it chains none."""
    modes = [m for m in (_entry_mode(e, state_dir) for e in plugins) if m is not None]
    return strictest(*modes) if modes else None


def _cached_plugins(config: Any) -> list[Any]:
    """The plugin entries of a cached network configuration ([] when it cannot be read as a conflist)."""
    import base64
    import binascii

    from cni_reaper.gojson import pick

    try:
        conflist = jsonio.loads(base64.b64decode(config, validate=True)) if isinstance(config, str) else None
    except (ValueError, binascii.Error, RecursionError, UnicodeDecodeError):
        return []
    plugins = pick(conflist, ("plugins",)).get("plugins") if isinstance(conflist, dict) else None
    return plugins if isinstance(plugins, list) else []


def _entry_mode(entry: Any, state_dir: str) -> str | None:
    """The mode of one cached plugin entry when it is cni-reaper's: observe when it keeps another state
    directory (its own cni-reaper judges its attachments) or gives the mode twice; None for another plugin."""
    from cni_reaper.cni.conf import DEFAULT_STATE_DIR, entry_mode
    from cni_reaper.gojson import pick

    v = pick(entry, ("type", "mode", "stateDir")) if isinstance(entry, dict) else {}
    if v.get("type") != "cni-reaper":
        return None
    own = v.get("stateDir") or DEFAULT_STATE_DIR
    elsewhere = not isinstance(own, str) or os.path.realpath(own) != os.path.realpath(state_dir)
    return "observe" if elsewhere else entry_mode(entry, v, [])


class Results:
    """One cache's results directory, listed once and kept sorted: a sweep of many dead attachments looks up
    each one's entries by name prefix (a bisection), not with a listing of the whole directory each. `names`
    is None when the directory cannot be read."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir
        try:
            self.names: list[str] | None = sorted(os.listdir(results_dir(cache_dir)))
        except OSError:
            self.names = None

    def read(self, network: str, container_id: str) -> list[tuple[str, Cached | None]]:
        """Each file named for (network, container ID), any ifname, with its entry (None: it cannot be read);
        a name alone is ambiguous, the caller judges the content (_of)."""
        from bisect import bisect_left

        names, prefix = self.names or [], f"{network}-{container_id}-"
        i = bisect_left(names, prefix)
        mine = []
        while i < len(names) and names[i].startswith(prefix):
            mine.append(names[i])
            i += 1
        return list(zip(mine, self._entries(mine)))

    def of_network(self, network: str) -> list[Cached]:
        """Every readable entry of `network` (by its content; the file name starts with the network's)."""
        found = self._entries([n for n in self.names or [] if n.startswith(f"{network}-")])
        return [e for e in found if e is not None and e.network == network]

    def of_container(self, container_id: str) -> list[Cached] | None:
        """Every entry of `container_id`, any network (by its content; the file name holds the ID); None when
        one that may be of it cannot be read, or the directory cannot."""
        if self.names is None:
            return None
        found = self._entries([n for n in self.names if f"-{container_id}-" in n])
        if any(e is None for e in found):
            return None
        return [e for e in found if e is not None and e.container_id == container_id]

    def _entries(self, names: list[str]) -> list[Cached | None]:
        """The entries in files `names` (None: one cannot be read; none at all when the directory cannot)."""
        if not names:
            return []
        try:
            fd = os.open(results_dir(self.cache_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            return [_read(fd, n) for n in names]
        finally:
            os.close(fd)

    def to_forget(self, network: str, container_id: str, ifname: str, released: set[str]) -> list[Cached] | None:
        """The cached results of this attachment (any ifname when "") that name one of the `released`
        addresses: what forget() must rewrite. None when its own entry is there and cannot be read (too
        large, not a plain file, not JSON): it may name them, so its addresses must not be released."""
        found = self.read(network, container_id)
        own = attachment_name(network, container_id, ifname) if ifname else None
        if any(e is None and n == own for n, e in found):
            return None
        return [e for _, e in found if e is not None and _of(e, network, container_id)
                and not (ifname and e.ifname != ifname) and released & set(e.ips)]


def _of(e: Cached, network: str, container_id: str) -> bool:
    """Whether a cached entry is one of (network, container ID) by its content."""
    return e.network == network and e.container_id == container_id


def forget(cache_dir: str, jobs: list[tuple[Cached, set[str]]]) -> list[bool]:
    """Take each job's released addresses out of its cached result and write it back atomically (each file
    made durable, the directory once at the end); whether each was. A later DEL of the dead attachment then
    hands the plugins no address that another attachment may hold by then (the firewall plugin deletes the
    CNI-FORWARD rules of every address in prevResult)."""
    try:
        dfd = os.open(results_dir(cache_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return [False] * len(jobs)
    try:
        done = [_rewrite(dfd, e, released) for e, released in jobs]
        try:
            os.fsync(dfd)
        except OSError:
            done = [False] * len(jobs)
        return done
    finally:
        os.close(dfd)


def without(result: dict[str, Any], released: set[str]) -> dict[str, Any]:
    """A result without the IP configs of `released` addresses (and their routes stay: they name gateways)."""
    out = dict(result)
    if isinstance(result.get("ips"), list):
        out["ips"] = [ip for ip in result["ips"] if not (isinstance(ip, dict) and _result_ips({"ips": [ip]})
                                                         and _result_ips({"ips": [ip]})[0] in released)]
    for k in ("ip4", "ip6"):
        if isinstance(result.get(k), dict) and set(_result_ips({k: result[k]})) & released:
            out.pop(k)
    return out


_WRITTEN: dict[str, tuple[int, int, int, int] | None] = {}  # entry name -> the file this process last wrote there


def _rewrite(dfd: int, e: Cached, released: set[str]) -> bool:
    """Replace the entry atomically with its addresses `released` forgotten. An entry changed since `e` was
    read is left, unless the change is this process's own (another dead life of the entry, forgotten first):
    then what is there now is taken."""
    if not _unchanged(dfd, e):
        there = _stamp(dfd, e.name)
        now = _read(dfd, e.name) if there is not None and _WRITTEN.get(e.name) == there else None
        if now is None or (now.network, now.container_id, now.ifname) != (e.network, e.container_id, e.ifname):
            return False
        e = now
    doc = dict(e.doc)
    result = without(result_of(doc), released)
    doc["result"] = jsonio.dumps(result) if isinstance(doc.get("result"), str) else result
    if not _replace(dfd, e.name, jsonio.dumps(doc).encode(), was=e):
        return False
    _WRITTEN[e.name] = _stamp(dfd, e.name)
    return True


def _stamp(dfd: int, name: str) -> tuple[int, int, int, int] | None:
    """A file's (device, inode, modification time, size), None when it cannot be looked at."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _replace(dfd: int, name: str, data: bytes, mode: int | None = None, was: Cached | None = None) -> bool:
    """Replace entry `name` of the open results directory atomically: the new content is written beside the
    directory (libcni 1.3 reads every file in it as an attachment), never blocking (files.open_regular), with
    the entry's mode, and renamed over it. With `was`, only while the entry is still the one read (libcni
    rewrites an entry in place when the same attachment is added again: that new entry is never written
    over). False when it could not be (nothing changed then)."""
    tmp = f".cni-reaper.{name}.{os.getpid()}"
    try:
        pfd = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return False
    try:
        if mode is None:
            mode = stat.S_IMODE(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
        fd = open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, dir_fd=pfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if was is not None and not _unchanged(dfd, was):
            raise FileExistsError(errno.EEXIST, "rewritten since it was read")
        os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=dfd)  # the directory is made durable by forget()
        return True
    except OSError:
        try:
            os.unlink(tmp, dir_fd=pfd)
        except OSError:
            pass
        return False
    finally:
        os.close(pfd)


def _unchanged(dfd: int, e: Cached) -> bool:
    """Whether entry `e`'s file has the modification time and size it was read with."""
    now = _stamp(dfd, e.name)
    return now is not None and now[2:] == (e.mtime, len(e.text.encode("utf-8", "surrogateescape")))


def current(cache_dir: str, name: str) -> Cached | None:
    """Entry `name` of the cache as it is now (None: there is none, or it cannot be read as one)."""
    try:
        dfd = os.open(results_dir(cache_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read(dfd, name)
    finally:
        os.close(dfd)


def put_back(cache_dir: str, name: str, content: str) -> bool:
    """Entry `name` replaced by `content` as it was journaled (undo), atomically, made durable."""
    try:
        dfd = os.open(results_dir(cache_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        done = _replace(dfd, name, content.encode("utf-8", "surrogateescape"), 0o600)
        if done:
            os.fsync(dfd)
        return done
    except OSError:
        return False
    finally:
        os.close(dfd)
