"""CNI spec versions: which we speak, comparison, and which one a config asks for."""

from __future__ import annotations

from cni_reaper.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, CniError

# Every version the reference plugins accept (skel's version.All): 0.1.0 and 0.2.0 results carry ip4/ip6.
SUPPORTED = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = SUPPORTED[-1]
# libcni and skel treat a config without cniVersion as 0.1.0.
IMPLICIT = "0.1.0"


def parse(version: str) -> tuple[int, int, int]:
    """'1.0.0' -> (1, 0, 0); raise ValueError on anything that is not three dot-separated integers."""
    if not isinstance(version, str):
        raise ValueError(f"version must be a string, not {type(version).__name__}")
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() and p.isascii() and len(p) <= 6 for p in parts):
        raise ValueError(f"invalid version {version!r}: expected MAJOR.MINOR.PATCH")
    return (int(parts[0]), int(parts[1]), int(parts[2]))


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def _checked(wanted: object, listed: object) -> tuple[str | None, list[str] | None]:
    """`cniVersion` (None: absent) and `cniVersions`, once they have the types and shapes the spec gives."""
    if wanted is not None and not isinstance(wanted, str):
        raise CniError(DECODE_FAILURE, "cniVersion must be a string", repr(wanted)[:200])
    if listed is not None and (not isinstance(listed, list) or not all(isinstance(v, str) for v in listed)):
        raise CniError(DECODE_FAILURE, "cniVersions must be a list of version strings", repr(listed)[:200])
    if wanted is not None:
        try:
            parse(wanted)
        except ValueError as exc:
            raise CniError(DECODE_FAILURE, str(exc)) from None
    return wanted, listed


def negotiate(wanted: object, listed: object) -> str:
    """Pick the spec version to speak, given the config's `cniVersion` and `cniVersions` (decoded by
    gojson.pick: any key case, null = absent).

    `cniVersion` wins when we support it; empty or absent means 0.1.0, as in skel. A `cniVersions` list
    (CNI 1.1 conflists) is honoured when `cniVersion` is absent or unsupported: the highest version in
    both lists is used.
    """
    version, versions = _checked(None if wanted == "" else wanted, listed)
    if version is not None and version in SUPPORTED:
        return version
    if versions:
        common = [v for v in versions if v in SUPPORTED]
        if common:
            return max(common, key=parse)
    elif version is None:
        return IMPLICIT
    asked = version or (", ".join(versions) if versions else IMPLICIT)
    raise CniError(
        INCOMPATIBLE_VERSION,
        "incompatible CNI versions",
        f"config asks for {asked}; cni-reaper supports {', '.join(SUPPORTED)}: "
        "set cniVersion in the conflist to one of them",
    )
