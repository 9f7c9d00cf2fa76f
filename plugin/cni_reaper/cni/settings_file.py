"""cni-reaper's settings where there is no conflist entry to hold them (a wrapper in Nomad's own bridge
network, whose conflist Nomad builds in memory): a JSON file, by default /etc/cni-reaper/config.json, its path
overridable by CNI_REAPER_CONFIG (plugins inherit the Nomad agent's environment). The same keys as the
conflist entry (stateDir, ipamDataDir, cniCacheDir, backend, lockTimeout, logFile, mode), optionally per
network under "networks": {"<name>": {...}}, and cniPath (where a bare run looks for the real plugin) and
wrapTimeout (seconds cni-reaper's own work may take in one call). Keys are decoded as the conflist's are
(any case, null is absent); a file that cannot be used gives the defaults and a warning, never a failure."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

from cni_reaper import jsonio
from cni_reaper.gojson import pick

DEFAULT_FILE = "/etc/cni-reaper/config.json"
MAX_BYTES = 1 << 20
OWN_KEYS = ("stateDir", "ipamDataDir", "cniCacheDir", "backend", "lockTimeout", "logFile", "mode")
FILE_KEYS = (*OWN_KEYS, "cniPath", "wrapTimeout", "networks")
DEFAULT_WRAP_TIMEOUT = 10.0


class SettingsFile:
    __slots__ = ("cni_path", "keys", "networks", "path", "problem", "wrap_timeout")

    def __init__(self, path: str) -> None:
        self.path = path
        self.keys: dict[str, Any] = {}
        self.networks: dict[str, dict[str, Any]] = {}
        self.cni_path: str | None = None
        self.wrap_timeout = DEFAULT_WRAP_TIMEOUT
        self.problem = ""

    def for_network(self, name: str) -> dict[str, Any]:
        """The conflist-entry keys of network `name`: the file's, then the network's own over them."""
        return {**self.keys, **self.networks.get(name, {})}


def path_of(env: Mapping[str, str]) -> str:
    return env.get("CNI_REAPER_CONFIG") or DEFAULT_FILE


def load(env: Mapping[str, str]) -> SettingsFile:
    s = SettingsFile(path_of(env))
    try:
        data = _read_regular(s.path)
    except FileNotFoundError:
        return s
    except OSError as exc:
        s.problem = f"{s.path}: {exc.strerror}; using the defaults"
        return s
    try:
        doc = jsonio.loads(data) if len(data) <= MAX_BYTES else None
    except (ValueError, RecursionError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict):
        s.problem = f"{s.path} is not a JSON object (of at most 1 MiB); using the defaults"
        return s
    _take(s, pick(doc, FILE_KEYS, ("networks",)))
    return s


def _read_regular(path: str) -> bytes:
    """The file's first MAX_BYTES + 1 bytes; opened without blocking and refused unless it is a regular file (a
    FIFO or a device there would hang every wrapped call, the fingerprint included)."""
    import stat

    from cni_reaper.files import untrusted

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        why = untrusted(st, "it") or next(filter(None, (untrusted(os.stat(d), f"{d}, a directory it is reached through")
                                                        for d in _directories_of(path))), None)
        if why:  # as sudo refuses a sudoers file others could have written: never followed
            raise OSError(0, f"{why}: refused (it must be root's and writable by root alone)")
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _directories_of(path: str) -> list[str]:
    """The directory of `path` and of every symlink it is reached through: whoever may write in one of them
    may swap the file for another."""
    dirs, p = [], os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit of links followed
        dirs.append(os.path.dirname(p))
        if not os.path.islink(p):
            break
        p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
    return dirs


def _take(s: SettingsFile, v: dict[str, Any]) -> None:
    s.keys = {k: v[k] for k in OWN_KEYS if k in v}
    if isinstance(v.get("cniPath"), str):
        s.cni_path = v["cniPath"]
    t = v.get("wrapTimeout")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t <= 300:
        s.wrap_timeout = float(t)
    networks = v.get("networks")
    if isinstance(networks, dict):
        for name, keys in networks.items():
            if isinstance(keys, dict):
                s.networks[name] = pick(keys, OWN_KEYS)
            else:  # a value cni-reaper cannot use observes: that network is not cleaned on a guess
                s.networks[name] = {"mode": "observe"}
                s.problem = f"{s.path}: networks.{name} is not an object; that network observes"
    elif networks is not None:
        s.problem = f"{s.path}: networks is not an object; ignored"


def exists(env: Mapping[str, str]) -> bool:
    return os.path.exists(path_of(env))
