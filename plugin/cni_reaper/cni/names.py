"""Validation of the identifiers that come from outside (spec 1.1.0 and libcni's utils)."""

from __future__ import annotations

from cni_reaper.errors import INVALID_CONFIG, INVALID_ENV, UNKNOWN_CONTAINER, CniError

# Container IDs and network names share one grammar in the spec: ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$ (checked without
# `re`, whose import alone costs milliseconds on every call)
_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_REST = _FIRST | frozenset("_.-")


def _is_id(value: str) -> bool:
    return bool(value) and value[0] in _FIRST and all(c in _REST for c in value)
MAX_ID_LEN = 1024  # not in the spec; a bound so that a hostile value cannot bloat records and logs
MAX_IFNAME_LEN = 15  # IFNAMSIZ - 1


def container_id(value: str | None) -> str:
    if not value:
        raise CniError(UNKNOWN_CONTAINER, "missing containerID", "set CNI_CONTAINERID")
    if len(value) > MAX_ID_LEN or not _is_id(value):
        raise CniError(
            INVALID_ENV,
            "invalid characters in containerID",
            f"CNI_CONTAINERID must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$: {value[:200]!r}",
        )
    return value


def network_name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise CniError(INVALID_CONFIG, "missing network name", "set \"name\" in the network configuration")
    if len(value) > MAX_ID_LEN or not _is_id(value):
        raise CniError(
            INVALID_CONFIG,
            "invalid characters found in network name",
            f"the network name must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$: {value[:200]!r}",
        )
    return value


def ifname(value: str | None) -> str:
    if not value:
        raise CniError(INVALID_ENV, "interface name is empty", "set CNI_IFNAME")
    problem = None
    if len(value) > MAX_IFNAME_LEN:
        problem = f"is longer than {MAX_IFNAME_LEN} characters"
    elif value in (".", ".."):
        problem = "is '.' or '..'"
    elif any(c in "/:" or c.isspace() or c == "\0" for c in value):
        problem = "contains '/', ':', a NUL or whitespace"
    if problem:
        raise CniError(INVALID_ENV, f"interface name {problem}", f"CNI_IFNAME={value[:64]!r}")
    return value
