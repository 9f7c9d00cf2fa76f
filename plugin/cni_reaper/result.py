"""prevResult (CNI results 0.3.0 to 1.1.0), read on the hot path without pydantic.

`models.PrevResult` is the schema; this mirrors it (tests/unit/test_schema.py). Only the parts cni-reaper
reads are checked; the document itself is passed through untouched.
"""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any

from .conf import Invalid, _is_int
from .errors import INVALID_CONFIG, CniError
from .ipaddr import parse_cidr, parse_ip


def _ips(prev: dict[str, Any]) -> list[dict[str, Any]]:
    ifaces = prev.get("interfaces", [])
    if not isinstance(ifaces, list):
        raise Invalid("interfaces", "Input should be a valid list")
    for i, iface in enumerate(ifaces):
        if not isinstance(iface, dict):
            raise Invalid(f"interfaces.{i}", "Input should be a valid dictionary")
        if "name" not in iface:
            raise Invalid(f"interfaces.{i}.name", "Field required")
        for key in ("name", "mac", "sandbox"):
            if key in iface and not isinstance(iface[key], str):
                raise Invalid(f"interfaces.{i}.{key}", "Input should be a valid string")
    v = prev.get("cniVersion")
    if v is not None and not isinstance(v, str):
        raise Invalid("cniVersion", "Input should be a valid string")
    entries = prev.get("ips", [])
    if not isinstance(entries, list):
        raise Invalid("ips", "Input should be a valid list")
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        where = f"ips.{i}"
        if not isinstance(entry, dict):
            raise Invalid(where, "Input should be a valid dictionary")
        if "address" not in entry:
            raise Invalid(f"{where}.address", "Field required")
        if not isinstance(entry["address"], str):
            raise Invalid(f"{where}.address", "Input should be a valid string")
        version = entry.get("version")
        if version is not None and version not in ("4", "6"):
            raise Invalid(f"{where}.version", "Input should be '4' or '6'")
        gateway = entry.get("gateway")
        if gateway is not None and not isinstance(gateway, str):
            raise Invalid(f"{where}.gateway", "Input should be a valid string")
        index = entry.get("interface")
        if index is not None and (not _is_int(index) or index < 0):
            raise Invalid(f"{where}.interface", "Input should be a valid non-negative integer")
        try:
            family, address, prefix = parse_cidr(entry["address"])
            if version is not None and version != str(family):
                raise ValueError(f"address {entry['address']} is not IPv{version}")
            if gateway:
                parse_ip(gateway)
        except ValueError as exc:
            raise Invalid(where, f"Value error, {exc}") from None
        if index is not None and index >= len(ifaces):
            raise Invalid("", f"Value error, ips entry {entry['address']} names interface {index}, which does not exist")
        ip = {"address": address, "prefix": prefix, "family": family}
        if ip not in out:
            out.append(ip)
    return out


def recorded_ips(prev: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The IPs of a prevResult as the record keeps them: [{"address", "prefix", "family"}]."""
    if prev is None:
        return []
    try:
        return _ips(prev)
    except Invalid as exc:
        raise CniError(INVALID_CONFIG, "prevResult is not a valid CNI result", f"prevResult.{exc}") from None
