"""The attachment record as the hot path handles it: a plain dict, exactly the JSON document on disk.

`models.Record` (pydantic) is the schema of that document; tests check that every record the verbs write
validates against it. Here: building a record from an ADD, keeping earlier lives, and a structural check
of records read back from disk.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any

from . import __version__, netns

SCHEMA = 1
MAX_EARLIER = 16
Record = dict  # the JSON document, see models.Record


# -- timestamps (ISO 8601 UTC, microseconds; no datetime import on the hot path) ---------------------
def iso_now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def iso_to_epoch(text: str) -> float:
    """Parse what iso_now writes (and what pydantic writes: '...Z' or '+00:00')."""
    date, _, clock = text.partition("T")
    y, m, d = (int(x) for x in date.split("-"))
    clock = clock.rstrip("Z").split("+")[0]
    hh, mm, ss = clock.split(":")
    # days from civil (proleptic Gregorian), Howard Hinnant's algorithm
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    return days * 86400 + int(hh) * 3600 + int(mm) * 60 + float(ss)


# -- building -----------------------------------------------------------------------------------------
def incarnation(netns_path: str, ips: list[dict], port_mappings: list[dict]) -> dict[str, Any]:
    ident = netns.identity(netns_path)
    return {
        "netns": netns_path,
        "netnsId": {"dev": ident.dev, "ino": ident.ino} if ident else None,
        "ips": ips,
        "portMappings": port_mappings,
        "createdAt": iso_now(),
    }


def _ip_set(inc: dict) -> list:
    return sorted((ip["address"], ip["prefix"], ip["family"]) for ip in inc["ips"])


def same_life(a: dict, b: dict) -> bool:
    """Two incarnations are the same life when netns path, namespace and IPs agree (ports may be re-sent)."""
    return a["netns"] == b["netns"] and a["netnsId"] == b["netnsId"] and _ip_set(a) == _ip_set(b)


def merge(existing: Record | None, network: str, container_id: str, ifname: str, current: dict,
          cni_args: dict[str, str]) -> tuple[Record, bool]:
    """The record after an ADD (or an adopting CHECK). Returns (record, an earlier life was kept)."""
    earlier: list[dict] = []
    kept = False
    if existing is not None:
        earlier = list(existing["earlier"])
        old = existing["current"]
        if same_life(old, current) and existing["deleted"] is None:
            current = dict(current, createdAt=old["createdAt"])
        elif ips(old) - ips(current):
            # an earlier life whose addresses the new one does not hold: its rules are to be cleaned
            earlier.append(old)
            kept = True
    return {
        "schema": SCHEMA,
        "network": network,
        "containerID": container_id,
        "ifname": ifname,
        "current": current,
        "earlier": earlier[-MAX_EARLIER:],
        "cniArgs": dict(cni_args),
        "pluginVersion": __version__,
        "deleted": None,
    }, kept


def tombstone(netns_gone: bool, had_prev_result: bool, had_port_mappings: bool, verify: bool) -> dict:
    """`verify`: whether a sweep must look at the tables once the DEL is over. A DEL that the downstream
    plugins could do whole (live netns, prevResult and ports given, no earlier life) needs no look: when
    libcni has dropped its cache entry, every plugin's DEL succeeded."""
    return {"at": iso_now(), "netnsGone": netns_gone, "hadPrevResult": had_prev_result,
            "hadPortMappings": had_port_mappings, "verify": verify}


def key(record: Record) -> tuple[str, str, str]:
    return (record["network"], record["containerID"], record["ifname"])


def nsid(inc: dict) -> tuple[int, int] | None:
    n = inc.get("netnsId")
    return (n["dev"], n["ino"]) if n else None


def ips(*incs: dict) -> set[str]:
    return {ip["address"] for inc in incs for ip in inc["ips"]}


# -- checking what was read back ----------------------------------------------------------------------
def _typed(d: Any, fields: dict[str, tuple]) -> str | None:
    if not isinstance(d, dict):
        return "not an object"
    for name, types in fields.items():
        if name not in d:
            return f"missing {name}"
        if not isinstance(d[name], types) or (isinstance(d[name], bool) and bool not in types):
            return f"{name} has the wrong type"
    return None


_INC = {"netns": (str,), "netnsId": (dict, type(None)), "ips": (list,), "portMappings": (list,), "createdAt": (str,)}
_TOP = {"schema": (int,), "network": (str,), "containerID": (str,), "ifname": (str,), "current": (dict,),
        "earlier": (list,), "cniArgs": (dict,), "pluginVersion": (str,), "deleted": (dict, type(None))}


def problem(data: Any) -> str | None:
    """Why `data` is not a usable record (None when it is): the structure the verbs rely on."""
    err = _typed(data, _TOP)
    if err:
        return err
    if data["schema"] != SCHEMA:
        return f"schema {data['schema']} is not {SCHEMA}"
    for inc in [data["current"], *data["earlier"]]:
        err = _typed(inc, _INC)
        if err:
            return f"incarnation: {err}"
        if inc["netnsId"] is not None and _typed(inc["netnsId"], {"dev": (int,), "ino": (int,)}):
            return "incarnation: bad netnsId"
        for ip in inc["ips"]:
            if _typed(ip, {"address": (str,), "prefix": (int,), "family": (int,)}):
                return "incarnation: bad ips entry"
    if data["deleted"] is not None and _typed(data["deleted"], {"at": (str,)}):
        return "bad tombstone"
    try:  # only the tombstone's time is ever computed with
        if data["deleted"] is not None:
            iso_to_epoch(data["deleted"]["at"])
    except (ValueError, IndexError):
        return "bad timestamp"
    return None
