"""The plugin configuration, parsed on the hot path without pydantic.

`models.PluginConf` (pydantic, strict) is the schema; this mirrors it field by field, and
tests/unit/test_schema.py checks with generated inputs that both accept and refuse the same documents and
yield the same values. (pydantic-core's extension alone takes ≈ 35 ms to load here, most of the whole
budget of an ADD; see README, Performance.)
"""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any

from .errors import INVALID_CONFIG, CniError
from .ipaddr import parse_ip

DEFAULT_STATE_DIR = "/var/lib/cni/reaper"
DEFAULT_IPAM_DATA_DIR = "/var/lib/cni/networks"
DEFAULT_CNI_CACHE_DIR = "/var/lib/cni"
DEFAULT_LOG_FILE = "/var/log/cni-reaper.log"
BACKENDS = ("auto", "nft", "legacy")
PROTOCOLS = ("tcp", "udp", "sctp")
PORT_KEYS = {"hostport": "hostPort", "containerport": "containerPort", "protocol": "protocol", "hostip": "hostIP"}
MAX_PORT_MAPPINGS = 65535


class Invalid(ValueError):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _path(v: Any, key: str, empty_ok: bool = False) -> str:
    if not isinstance(v, str):
        raise Invalid(key, "Input should be a valid string")
    if empty_ok and v == "":
        return v
    if not v.startswith("/") or "\0" in v or len(v) > 1024:
        raise Invalid(key, f"Value error, {key} must be an absolute path")
    return v


class PortMapping:
    __slots__ = ("hostPort", "containerPort", "protocol", "hostIP")

    def __init__(self, hostPort: int, containerPort: int, protocol: str = "tcp", hostIP: str = "") -> None:
        self.hostPort, self.containerPort, self.protocol, self.hostIP = hostPort, containerPort, protocol, hostIP

    def as_dict(self) -> dict[str, Any]:
        return {"hostPort": self.hostPort, "containerPort": self.containerPort, "protocol": self.protocol,
                "hostIP": self.hostIP}


def port_mapping(raw: Any, where: str) -> PortMapping:
    """Go decodes JSON keys case-insensitively and go-cni sends untagged fields ("HostPort"): accept both."""
    if not isinstance(raw, dict):
        raise Invalid(where, "Input should be a valid dictionary")
    v = {PORT_KEYS.get(k.lower(), k) if isinstance(k, str) else k: val for k, val in raw.items()}
    out = {}
    for key in ("hostPort", "containerPort"):
        if key not in v:
            raise Invalid(f"{where}.{key}", "Field required")
        if not _is_int(v[key]):
            raise Invalid(f"{where}.{key}", "Input should be a valid integer")
        if not 1 <= v[key] <= 65535:
            raise Invalid(f"{where}.{key}", "Input should be between 1 and 65535")
        out[key] = v[key]
    proto = v.get("protocol", "tcp")
    if not isinstance(proto, str) or proto.lower() not in PROTOCOLS:
        raise Invalid(f"{where}.protocol", "Input should be 'tcp', 'udp' or 'sctp'")
    host_ip = v.get("hostIP", "")
    if not isinstance(host_ip, str):
        raise Invalid(f"{where}.hostIP", "Input should be a valid string")
    if host_ip:
        try:
            parse_ip(host_ip)
        except ValueError as exc:
            raise Invalid(f"{where}.hostIP", f"Value error, {exc}") from None
    return PortMapping(out["hostPort"], out["containerPort"], proto.lower(), host_ip)


class RuntimeConfig:
    __slots__ = ("portMappings",)

    def __init__(self, portMappings: list[PortMapping] | None = None) -> None:
        self.portMappings = portMappings or []


class Conf:
    """Attribute for attribute what models.PluginConf holds."""

    __slots__ = ("cniVersion", "cniVersions", "name", "type", "stateDir", "ipamDataDir", "cniCacheDir", "backend",
                 "lockTimeout", "logFile", "prevResult", "runtimeConfig")

    def __init__(self, **kw: Any) -> None:
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


def _parse(raw: dict[str, Any]) -> Conf:
    c = Conf()
    for key in ("cniVersion",):
        v = raw.get(key)
        if v is not None and not isinstance(v, str):
            raise Invalid(key, "Input should be a valid string")
        setattr(c, key, v)
    v = raw.get("cniVersions")
    if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
        raise Invalid("cniVersions", "Input should be a valid list of strings")
    c.cniVersions = v
    if "name" not in raw:
        raise Invalid("name", "Field required")
    if not isinstance(raw["name"], str):
        raise Invalid("name", "Input should be a valid string")
    c.name = raw["name"]
    c.type = raw.get("type", "")
    if not isinstance(c.type, str):
        raise Invalid("type", "Input should be a valid string")
    c.stateDir = _path(raw.get("stateDir", DEFAULT_STATE_DIR), "stateDir")
    c.ipamDataDir = _path(raw.get("ipamDataDir", DEFAULT_IPAM_DATA_DIR), "ipamDataDir")
    c.cniCacheDir = _path(raw.get("cniCacheDir", DEFAULT_CNI_CACHE_DIR), "cniCacheDir")
    c.backend = raw.get("backend", "auto")
    if not isinstance(c.backend, str) or c.backend not in BACKENDS:
        raise Invalid("backend", "Input should be 'auto', 'nft' or 'legacy'")
    t = raw.get("lockTimeout", 10.0)
    if not (_is_int(t) or isinstance(t, float)) or t != t:
        raise Invalid("lockTimeout", "Input should be a valid number")
    if not 0 < t <= 300:
        raise Invalid("lockTimeout", "Input should be greater than 0 and at most 300")
    c.lockTimeout = float(t)
    c.logFile = _path(raw.get("logFile", DEFAULT_LOG_FILE), "logFile", empty_ok=True)
    prev = raw.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise Invalid("prevResult", "Input should be a valid dictionary")
    c.prevResult = prev
    rc = raw.get("runtimeConfig", {})
    if not isinstance(rc, dict):
        raise Invalid("runtimeConfig", "Input should be a valid dictionary")
    pms = rc.get("portMappings", [])
    if not isinstance(pms, list):
        raise Invalid("runtimeConfig.portMappings", "Input should be a valid list")
    if len(pms) > MAX_PORT_MAPPINGS:
        raise Invalid("runtimeConfig.portMappings", f"List should have at most {MAX_PORT_MAPPINGS} items")
    c.runtimeConfig = RuntimeConfig([port_mapping(p, f"runtimeConfig.portMappings.{i}") for i, p in enumerate(pms)])
    return c


def parse(raw: dict[str, Any]) -> Conf:
    try:
        return _parse(raw)
    except Invalid as exc:
        raise CniError(INVALID_CONFIG, "invalid cni-reaper configuration", str(exc)) from None
