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

from cni_reaper import __version__
from cni_reaper.reap import netns

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
# models.Record is the schema; this says the same (tests/unit/test_schema.py holds the two together).
_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
PROTOCOLS = ("tcp", "udp", "sctp")
_ZONES = ("", "Z", "+00:00", "-00:00")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _digits(text: str) -> bool:
    return text.isdigit()  # the caller has checked that the text is ASCII


def _time_ok(v: Any) -> bool:
    """YYYY-MM-DDTHH:MM:SS[.ffffff] in UTC (Z, +00:00 or none), as iso_now() or pydantic write it; checked
    without `re`, whose import costs milliseconds on every call."""
    if not isinstance(v, str) or len(v) < 19 or not v.isascii():
        return False
    if v[4] != "-" or v[7] != "-" or v[10] != "T" or v[13] != ":" or v[16] != ":":
        return False
    fields = (v[0:4], v[5:7], v[8:10], v[11:13], v[14:16], v[17:19])
    if not all(_digits(f) for f in fields):
        return False
    tail = v[19:]
    if tail.startswith("."):
        n = 1
        while n < len(tail) and tail[n].isdigit():
            n += 1
        if not 2 <= n <= 7:
            return False
        tail = tail[n:]
    if tail not in _ZONES:
        return False
    y, mo, d, h, mi, sec = (int(f) for f in fields)
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    return (y > 0 and 1 <= mo <= 12 and 1 <= d <= (_DAYS[mo - 1] if mo != 2 or leap else 28) and h < 24
            and mi < 60 and sec < 60)


def _keys(d: Any, required: frozenset, optional: frozenset = frozenset()) -> bool:
    if not isinstance(d, dict):
        return False
    keys = d.keys()
    return keys == required or (keys >= required and keys <= required | optional)


_INCARNATION = frozenset(("netns", "netnsId", "ips", "portMappings", "createdAt"))
_NETNS_ID = frozenset(("dev", "ino"))
_IP = frozenset(("address", "prefix", "family"))
_PORT = frozenset(("hostPort", "containerPort", "protocol", "hostIP"))
_RECORD = frozenset(("schema", "network", "containerID", "ifname", "current", "earlier", "cniArgs", "pluginVersion",
                     "deleted"))
_TOMBSTONE = frozenset(("at", "netnsGone", "hadPrevResult", "hadPortMappings"))
_TOMBSTONE_OPTIONAL = frozenset(("verify",))


def _incarnation_problem(inc: Any) -> str | None:
    if not _keys(inc, _INCARNATION):
        return "incarnation: not an object with exactly netns, netnsId, ips, portMappings, createdAt"
    if not isinstance(inc["netns"], str) or not _time_ok(inc["createdAt"]):
        return "incarnation: bad netns or createdAt"
    ns = inc["netnsId"]
    if ns is not None and not (_keys(ns, _NETNS_ID) and _is_int(ns["dev"]) and _is_int(ns["ino"])):
        return "incarnation: bad netnsId"
    if not isinstance(inc["ips"], list) or not all(
            _keys(ip, _IP) and isinstance(ip["address"], str) and _is_int(ip["prefix"])
            and 0 <= ip["prefix"] <= 128 and _is_int(ip["family"]) and ip["family"] in (4, 6) for ip in inc["ips"]):
        return "incarnation: bad ips entry"
    if not isinstance(inc["portMappings"], list) or not all(
            _keys(p, _PORT) and _is_int(p["hostPort"])
            and 1 <= p["hostPort"] <= 65535 and _is_int(p["containerPort"]) and 1 <= p["containerPort"] <= 65535
            and p["protocol"] in PROTOCOLS and isinstance(p["hostIP"], str) for p in inc["portMappings"]):
        return "incarnation: bad portMappings entry"
    return None


def problem(data: Any) -> str | None:
    """Why `data` is not a record (None when it is one): what models.Record says, in plain Python."""
    if not _keys(data, _RECORD):
        return "not an object with exactly the record's keys"
    if not _is_int(data["schema"]) or data["schema"] != SCHEMA:
        return f"schema {data['schema']!r} is not {SCHEMA}"
    if not all(isinstance(data[k], str) for k in ("network", "containerID", "ifname", "pluginVersion")):
        return "network, containerID, ifname and pluginVersion must be strings"
    if not isinstance(data["earlier"], list) or len(data["earlier"]) > MAX_EARLIER:
        return f"earlier must be a list of at most {MAX_EARLIER} incarnations"
    for inc in [data["current"], *data["earlier"]]:
        err = _incarnation_problem(inc)
        if err:
            return err
    args = data["cniArgs"]
    if not isinstance(args, dict) or not all(isinstance(v, str) for v in args.values()):
        return "cniArgs must map strings to strings"
    dead = data["deleted"]
    if dead is not None and not (
            _keys(dead, _TOMBSTONE, _TOMBSTONE_OPTIONAL) and _time_ok(dead["at"])
            and all(isinstance(v, bool) for k, v in dead.items() if k != "at")):
        return "bad tombstone"
    return None
