"""prevResult (CNI results 0.1.0 to 1.1.0), read on the hot path without pydantic.

`models.PrevResult` is the schema; this mirrors it (tests/unit/test_schema.py). The rules are those of the
Go result types the reference plugins decode a prevResult into (libcni's types020/040/100, through gojson):
what they refuse is refused here (an address that is not CIDR, a gateway that is not an IP, a field of the
wrong JSON type); what they accept is accepted (any key case, nulls, unknown keys, interface indexes out of
range, a `version` that does not match the address). Only the addresses are kept; the document itself is
passed through untouched.
"""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any

from cni_reaper.cni.conf import Invalid, _is_int
from cni_reaper.cni.ipaddr import parse_go_cidr, parse_ip
from cni_reaper.errors import INVALID_CONFIG, CniError
from cni_reaper.gojson import pick
from cni_reaper.values import Value

RESULT_FIELDS = ("cniVersion", "interfaces", "ips", "ip4", "ip6")
RESULT_RESETTABLE = ("interfaces", "ips", "ip4", "ip6")
IP_FIELDS = ("address", "gateway", "interface", "version")
IP_RESETTABLE = ("gateway", "interface")
OLD_IP_FIELDS = ("ip", "gateway")  # 0.1.0 / 0.2.0: "ip4": {"ip": ..., "gateway": ...}
IFACE_FIELDS = ("name", "mac", "sandbox", "mtu", "socketPath", "pciID")
OLD_VERSIONS = ("0.1.0", "0.2.0")


def _string(v: dict[str, Any], key: str, where: str) -> None:
    if key in v and not isinstance(v[key], str):
        raise Invalid(f"{where}.{key}", "Input should be a valid string")


def _check_interfaces(ifaces: Any) -> None:
    if not isinstance(ifaces, list):
        raise Invalid("interfaces", "Input should be a valid list")
    for i, iface in enumerate(ifaces):
        if iface is None:
            continue  # a nil *Interface
        if not isinstance(iface, dict):
            raise Invalid(f"interfaces.{i}", "Input should be a valid dictionary")
        v = pick(iface, IFACE_FIELDS)
        for key in ("name", "mac", "sandbox", "socketPath", "pciID"):
            _string(v, key, f"interfaces.{i}")
        if "mtu" in v and not _is_int(v["mtu"]):
            raise Invalid(f"interfaces.{i}.mtu", "Input should be a valid integer")


class Assigned(Value):
    """An address a result gives the attachment: the address, its prefix length, its family (4 or 6)."""

    __slots__ = ("address", "family", "prefix")

    def __init__(self, address: str, prefix: int, family: int) -> None:
        self.address, self.prefix, self.family = address, prefix, family


def _address(v: dict[str, Any], key: str, where: str) -> Assigned | None:
    """One IP config's address, None when it has none (Go leaves it empty)."""
    _gateway(v, where)
    if key not in v:
        return None
    text = v[key]
    if not isinstance(text, str):
        raise Invalid(f"{where}.{key}", "Input should be a valid string")
    try:
        family, address, prefix = parse_go_cidr(text)
    except ValueError as exc:
        raise Invalid(f"{where}.{key}", f"Value error, {exc}") from None
    return Assigned(address, prefix, family)


def _gateway(v: dict[str, Any], where: str) -> None:
    gateway = v.get("gateway")
    if gateway is None:
        return
    if not isinstance(gateway, str):
        raise Invalid(f"{where}.gateway", "Input should be a valid string")
    if gateway:
        try:
            parse_ip(gateway)
        except ValueError as exc:
            raise Invalid(f"{where}.gateway", f"Value error, {exc}") from None


def _old_ips(top: dict[str, Any]) -> list[Assigned | None]:
    """`ip4` and `ip6` of a 0.1.0 or 0.2.0 result."""
    found = []
    for key in ("ip4", "ip6"):
        if key in top:
            if not isinstance(top[key], dict):
                raise Invalid(key, "Input should be a valid dictionary")
            found.append(_address(pick(top[key], OLD_IP_FIELDS), "ip", key))
    return found


def _new_ips(top: dict[str, Any]) -> list[Assigned | None]:
    """`ips` of a 0.3.0 or later result (and its interfaces checked as Go decodes them)."""
    if "interfaces" in top:
        _check_interfaces(top["interfaces"])
    entries = top.get("ips", [])
    if not isinstance(entries, list):
        raise Invalid("ips", "Input should be a valid list")
    found = []
    for i, entry in enumerate(entries):
        if entry is None:
            continue  # a nil *IPConfig
        where = f"ips.{i}"
        if not isinstance(entry, dict):
            raise Invalid(where, "Input should be a valid dictionary")
        v = pick(entry, IP_FIELDS, IP_RESETTABLE)
        _string(v, "version", where)
        if "interface" in v and not _is_int(v["interface"]):
            raise Invalid(f"{where}.interface", "Input should be a valid integer")
        found.append(_address(v, "address", where))
    return found


def _ips(prev: dict[str, Any], version: str) -> list[Assigned]:
    top = pick(prev, RESULT_FIELDS, RESULT_RESETTABLE)
    if "cniVersion" in top and not isinstance(top["cniVersion"], str):
        raise Invalid("cniVersion", "Input should be a valid string")
    version = top.get("cniVersion") or version
    found = _old_ips(top) if version in OLD_VERSIONS else _new_ips(top)
    out: list[Assigned] = []
    for ip in found:
        if ip is not None and ip not in out:
            out.append(ip)
    return out


def recorded_ips(prev: dict[str, Any] | None, version: str = "1.0.0") -> list[Assigned]:
    """The addresses of a prevResult, once each. `version` is the
    config's, used when the result names none (as libcni's ParsePrevResult does)."""
    if prev is None:
        return []
    try:
        return _ips(prev, version)
    except Invalid as exc:
        raise CniError(INVALID_CONFIG, "prevResult is not a valid CNI result", f"prevResult.{exc}") from None


def host_veths(prev: dict[str, Any] | None) -> list[str]:
    """The host side of the container's veth pair in a (valid) prevResult: the interfaces without a sandbox
    whose name is the one bridge and ptp give it (`veth` and 8 hex digits). It lives in the host's network
    namespace and dies with the container's."""
    if prev is None:
        return []
    ifaces = pick(prev, RESULT_FIELDS, RESULT_RESETTABLE).get("interfaces")
    out = []
    for iface in ifaces if isinstance(ifaces, list) else []:
        if isinstance(iface, dict):
            v = pick(iface, IFACE_FIELDS)
            name = v.get("name")
            if isinstance(name, str) and name.startswith("veth") and not v.get("sandbox"):
                out.append(name)
    return out
