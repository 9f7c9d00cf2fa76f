"""The plugin configuration, parsed on the hot path without pydantic.

`models.PluginConf` (pydantic) is the schema; this mirrors it field by field, and tests/unit/test_schema.py
checks with generated inputs that both accept and refuse the same documents and yield the same values.
(pydantic-core's extension alone takes ≈ 35 ms to load here, most of the whole budget of an ADD; see
docs/performance.md.)

Never block an allocation (docs/how-it-works.md): keys are decoded the way the Go reference plugins decode theirs
(gojson: case-insensitive keys, null = absent, unknown keys ignored), and a value of one of cni-reaper's
own keys that it cannot use costs a warning and the default, never the allocation. The one exception is
`stateDir`: without a usable state directory nothing can be recorded (as host-local fails on an unusable
`dataDir`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any

from cni_reaper.cni.ipaddr import parse_ip
from cni_reaper.errors import INVALID_CONFIG, CniError
from cni_reaper.gojson import pick

DEFAULT_STATE_DIR = "/var/lib/cni/reaper"
DEFAULT_IPAM_DATA_DIR = "/var/lib/cni/networks"
# where host-local keeps reservations when nothing says otherwise: its default, and Nomad 1.9.4+'s bridge network
DEFAULT_IPAM_DIRS = (DEFAULT_IPAM_DATA_DIR, "/var/run/cni")
DEFAULT_CNI_CACHE_DIR = "/var/lib/cni"
DEFAULT_LOG_FILE = "/var/log/cni-reaper.log"
DEFAULT_LOCK_TIMEOUT = 10.0
MAX_LOCK_TIMEOUT = 300.0
BACKENDS = ("auto", "nft", "legacy")
MODES = ("clean", "observe")  # observe: judge and say what would go, remove nothing
PROTOCOLS = ("tcp", "udp", "sctp")
MAX_PORT_MAPPINGS = 65535
MAX_PATH = 1024

# The fields of each object, as the Go structs name them; the second tuple: slice, map or pointer fields
# (a null resets them). runtimeConfig is a struct value in portmap's NetConf: a null leaves it alone.
TOP_FIELDS = ("cniVersion", "cniVersions", "name", "type", "stateDir", "ipamDataDir", "cniCacheDir", "backend",
              "lockTimeout", "logFile", "mode", "prevResult", "runtimeConfig", "capabilities")
TOP_RESETTABLE = ("cniVersions", "prevResult", "capabilities")
RUNTIME_FIELDS = ("portMappings",)
PORT_FIELDS = ("hostPort", "containerPort", "protocol", "hostIP")


class Invalid(ValueError):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def path_problem(v: Any, key: str) -> str | None:
    """Why `v` is not a usable absolute path (None when it is one)."""
    if not isinstance(v, str):
        return f"{key} must be a string"
    if not v.startswith("/") or "\0" in v or len(v) > MAX_PATH:
        return f"{key} must be an absolute path"
    return None


class PortMapping:
    __slots__ = ("containerPort", "hostIP", "hostPort", "protocol")

    def __init__(self, hostPort: int, containerPort: int, protocol: str = "tcp", hostIP: str = "") -> None:
        self.hostPort, self.containerPort, self.protocol, self.hostIP = hostPort, containerPort, protocol, hostIP


def port_mapping(raw: Any) -> PortMapping:
    """One entry of runtimeConfig.portMappings (go-cni sends untagged Go fields: "HostPort", ...).
    Invalid when it could not map a port (portmap refuses such an entry, or iptables does)."""
    if not isinstance(raw, dict):
        raise Invalid("entry", "not an object")
    v = pick(raw, PORT_FIELDS)
    for key in ("hostPort", "containerPort"):
        if key not in v:
            raise Invalid(key, "missing")
        if not _is_int(v[key]) or not 1 <= v[key] <= 65535:
            raise Invalid(key, "not a port number (1-65535)")
    proto = v.get("protocol", "") or "tcp"
    if not isinstance(proto, str) or proto.lower() not in PROTOCOLS:
        raise Invalid("protocol", "not tcp, udp or sctp")
    host_ip = v.get("hostIP", "")
    if not isinstance(host_ip, str):
        raise Invalid("hostIP", "not a string")
    if host_ip:
        try:
            parse_ip(host_ip)
        except ValueError:
            raise Invalid("hostIP", "not an IP address") from None
    return PortMapping(v["hostPort"], v["containerPort"], proto.lower(), host_ip)


def port_mappings(runtime_config: Any, warnings: list[str]) -> list[PortMapping]:
    """The usable entries of runtimeConfig.portMappings. cni-reaper only records them (the DNAT rules it
    removes are found by their owner tag), so an entry it cannot use is skipped with a warning."""
    if not isinstance(runtime_config, dict):
        if runtime_config is not None:
            warnings.append("runtimeConfig is not an object; no port mappings recorded")
        return []
    pms = pick(runtime_config, RUNTIME_FIELDS, RUNTIME_FIELDS).get("portMappings", [])
    if not isinstance(pms, list):
        warnings.append("runtimeConfig.portMappings is not a list; no port mappings recorded")
        return []
    out: list[PortMapping] = []
    for i, entry in enumerate(pms[:MAX_PORT_MAPPINGS]):
        if entry is None:
            continue  # a nil pointer in Go's eyes; nothing to record
        try:
            out.append(port_mapping(entry))
        except Invalid as exc:
            warnings.append(f"runtimeConfig.portMappings.{i} skipped: {exc}")
    return out


class Conf:
    """What models.PluginConf holds (runtimeConfig.portMappings as `portMappings`), plus `warnings`: what
    was not usable, for the verb to log."""

    __slots__ = (
        "backend",
        "cniCacheDir",
        "ipamDataDir",
        "lockTimeout",
        "logFile",
        "mode",
        "name",
        "portMappings",
        "portMappingsDeclared",
        "prevResult",
        "stateDir",
        "type",
        "warnings",
        "wrapped_by",
    )
    backend: str
    cniCacheDir: str
    ipamDataDir: str
    lockTimeout: float
    logFile: str
    mode: str
    name: str
    portMappings: list[PortMapping]
    portMappingsDeclared: bool
    prevResult: dict[str, Any] | None
    stateDir: str | None  # None only for a DEL that goes on without one
    type: str
    warnings: list[str]
    wrapped_by: Any  # cni.settings_file.SettingsFile: the settings file of the wrapper that serves this call (None: chained)

    def __init__(self, **kw: Any) -> None:
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


def _own_path(v: dict[str, Any], key: str, default: str, warnings: list[str], empty_ok: bool = False) -> str:
    if key not in v:
        return default
    value = v[key]
    if empty_ok and value == "":
        return value
    problem = path_problem(value, key)
    if problem:
        warnings.append(f"{problem}; using the default {default}")
        return default
    return value


def _state_dir(v: dict[str, Any], lenient: bool, warnings: list[str]) -> str | None:
    state = v.get("stateDir", DEFAULT_STATE_DIR)
    problem = path_problem(state, "stateDir")
    if problem and lenient:
        warnings.append(f"{problem}; no record can be read")
        return None
    if problem:
        raise CniError(INVALID_CONFIG, "invalid cni-reaper configuration",
                       f"{problem}: set stateDir to a directory where cni-reaper may keep its records")
    return state


def _backend(v: dict[str, Any], warnings: list[str]) -> str:
    given = v.get("backend", "auto")
    backend = (given.lower() or "auto") if isinstance(given, str) else given
    if backend not in BACKENDS:
        warnings.append(f"backend {given!r} is not auto, nft or legacy; using auto")
        return "auto"
    return backend


def mode_of(v: dict[str, Any], warnings: list[str]) -> str:
    """clean (the default) or observe; a value that is neither is taken for observe, the safe side (a typo
    must not make a janitor remove what its operator only meant it to watch)."""
    given = v.get("mode", "clean")
    mode = (given.lower() or "clean") if isinstance(given, str) else given
    if mode not in MODES:
        warnings.append(f"mode {given!r} is not clean or observe; observing (nothing is removed)")
        return "observe"
    return mode


def _lock_timeout(v: dict[str, Any], warnings: list[str]) -> float:
    t = v.get("lockTimeout", 0)
    if (not _is_int(t) and not isinstance(t, float)) or t != t or t < 0 or t > MAX_LOCK_TIMEOUT:
        warnings.append(f"lockTimeout {t!r} is not a number of seconds from 0 to {MAX_LOCK_TIMEOUT:g}; "
                        f"using {DEFAULT_LOCK_TIMEOUT:g}")
        t = 0
    return float(t) or DEFAULT_LOCK_TIMEOUT


def _prev_result(v: dict[str, Any], lenient: bool, warnings: list[str]) -> dict[str, Any] | None:
    prev = v.get("prevResult")
    if prev is None or isinstance(prev, dict):
        return prev
    if lenient:
        warnings.append("prevResult is not an object; ignored")
        return None
    raise CniError(INVALID_CONFIG, "prevResult is not a valid CNI result", "prevResult must be an object")


def parse(raw: dict[str, Any], top: dict[str, Any] | None = None, lenient: bool = False) -> Conf:
    """The configuration (`top`: `raw` already decoded by pick). Raises CniError (7) only for a missing
    network name, an unusable state directory, or a prevResult that is not an object; with `lenient` (DEL,
    which must go on whatever it is given) not even for those: stateDir is then None, prevResult None."""
    v = pick(raw, TOP_FIELDS, TOP_RESETTABLE) if top is None else top
    warnings: list[str] = []
    c = Conf(warnings=warnings)
    name = v.get("name")
    if not isinstance(name, str) or not name:
        raise CniError(INVALID_CONFIG, "invalid cni-reaper configuration", "name: the network name is missing")
    c.name = name
    c.type = v["type"] if isinstance(v.get("type"), str) else ""
    c.stateDir = _state_dir(v, lenient, warnings)
    c.ipamDataDir = _own_path(v, "ipamDataDir", DEFAULT_IPAM_DATA_DIR, warnings)
    c.cniCacheDir = _own_path(v, "cniCacheDir", DEFAULT_CNI_CACHE_DIR, warnings)
    c.logFile = _own_path(v, "logFile", DEFAULT_LOG_FILE, warnings, empty_ok=True)
    c.backend = _backend(v, warnings)
    c.mode = mode_of(v, warnings)
    c.lockTimeout = _lock_timeout(v, warnings)
    c.prevResult = _prev_result(v, lenient, warnings)
    caps = v.get("capabilities")
    c.portMappingsDeclared = isinstance(caps, dict) and caps.get("portMappings") is True
    c.portMappings = port_mappings(v.get("runtimeConfig"), warnings)
    return c
