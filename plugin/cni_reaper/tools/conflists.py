"""The conflists an operator installed: which networks chain cni-reaper, and with which keys.

Read the way Nomad finds a network in its `cni_config_dir` (and libcni's ConfFiles lists a directory): the
files ending `.conf`, `.conflist` or `.json`, in name order; the first one that names a network is that
network (a later file with the same name is shadowed). A conflist chains cni-reaper when one of its plugins
has `"type": "cni-reaper"`; that entry, with the conflist's `name` and `cniVersion` put in as libcni puts
them in, is what cni-reaper is given on every call, and so what the CLI uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cni_reaper import PLUGIN_NAME, jsonio
from cni_reaper.gojson import pick

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.reap.engine import Keeping

DEFAULT_DIRS = ("/opt/cni/config", "/etc/cni/net.d")  # Nomad's cni_config_dir default, then the CNI convention
EXTENSIONS = (".conf", ".conflist", ".json")
MAX_BYTES = 1 << 20
LIST_FIELDS = ("cniVersion", "name", "plugins", "disableCheck", "disableGC")
PLUGIN_FIELDS = ("type", "capabilities", "ipam")


@dataclass
class Network:
    """A network whose conflist chains cni-reaper."""

    name: str
    path: str
    cni_version: str
    plugins: list[dict]  # every entry, as written
    position: int  # cni-reaper's entry in plugins
    shadowed_by: str | None = None  # an earlier file that names the same network (Nomad uses that one)

    @property
    def entry(self) -> dict:
        return self.plugins[self.position]

    def types(self) -> list[str]:
        return [plugin_type(p) for p in self.plugins]

    def ipams(self) -> list[dict]:
        """The IPAM section of every entry that has one."""
        from cni_reaper.gojson import pick

        found = [pick(p, ("ipam",)).get("ipam") if isinstance(p, dict) else None for p in self.plugins]
        return [i for i in found if isinstance(i, dict)]

    def host_local_dirs(self) -> list[str]:
        """The dataDir of every host-local IPAM in the chain (its default when unset)."""
        from cni_reaper.cni.conf import DEFAULT_IPAM_DATA_DIR
        from cni_reaper.gojson import pick

        out = []
        for ipam in self.ipams():
            v = pick(ipam, ("type", "dataDir"))
            if v.get("type") == "host-local":
                d = v.get("dataDir")
                out.append(d if isinstance(d, str) and d else DEFAULT_IPAM_DATA_DIR)
        return out

    def keeping(self) -> Keeping:
        """Where host-local keeps every address of this network, when host-local is the chain's only IPAM (no
        data dir otherwise: another IPAM keeps no reservations to show who holds what), and the subnets of its
        ranges."""
        from cni_reaper.reap.engine import keeping

        dirs = self.host_local_dirs()
        if not dirs or len(dirs) != len(self.ipams()):
            return keeping()
        subnets = []
        for ipam in self.ipams():
            v = pick(ipam, ("subnet", "ranges"))
            ranges = v.get("ranges")
            sets: list = ranges if isinstance(ranges, list) else [[{"subnet": v.get("subnet")}]]
            for r in (r for rs in sets if isinstance(rs, list) for r in rs if isinstance(r, dict)):
                subnet = pick(r, ("subnet",)).get("subnet")
                subnets += [subnet] if isinstance(subnet, str) else []
        return keeping(dirs[0], subnets)

    def raw_conf(self) -> dict:
        """cni-reaper's entry as libcni hands it over: with the list's name and cniVersion."""
        return {**self.entry, "name": self.name, "cniVersion": self.cni_version}


@dataclass
class Scan:
    networks: list[Network] = field(default_factory=list)  # those chaining cni-reaper, first file first
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    dirs: list[str] = field(default_factory=list)  # the directories that exist


def plugin_type(entry: object) -> str:
    if not isinstance(entry, dict):
        return ""
    t = pick(entry, PLUGIN_FIELDS).get("type")
    return t if isinstance(t, str) else ""


def files(directory: str) -> list[str]:
    """The configuration files of one directory, in the order libcni reads them."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(EXTENSIONS))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))]


def read(path: str) -> dict:
    """One file's document; ValueError (with why) when it is no JSON object."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(exc.strerror or str(exc)) from None
    if len(data) > MAX_BYTES:
        raise ValueError("larger than 1 MiB")
    try:
        doc = jsonio.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def scan(dirs: list[str] | tuple[str, ...] = DEFAULT_DIRS) -> Scan:
    """Every network in `dirs` whose conflist chains cni-reaper. A single-plugin `.conf` is a network too
    (it shadows a later conflist of the same name) but cannot chain cni-reaper."""
    out = Scan()
    seen: dict[str, str] = {}
    for d in dirs:
        if os.path.isdir(d):
            out.dirs.append(d)
        for path in files(d):
            try:
                doc = pick(read(path), LIST_FIELDS, ("plugins",))
            except ValueError as exc:
                out.unreadable.append((path, str(exc)))
                continue
            name = doc.get("name")
            if not isinstance(name, str) or not name:
                continue
            plugins = doc.get("plugins")
            first = seen.setdefault(name, path)
            if not isinstance(plugins, list):
                continue
            types = [plugin_type(p) for p in plugins]
            if PLUGIN_NAME not in types:
                continue
            version = doc.get("cniVersion")
            out.networks.append(Network(name, path, version if isinstance(version, str) else "", plugins,
                                        types.index(PLUGIN_NAME), None if first == path else first))
    return out
