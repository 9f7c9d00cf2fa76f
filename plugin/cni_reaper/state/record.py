"""The attachment record as the hot path handles it: a plain dict, exactly the JSON document on disk.

`models.Record` (pydantic) is the schema of that document; tests check that every record the verbs write
validates against it. Here: building a record from what an ADD observed (reap/probes.py makes the
observations; this module only shapes them), keeping earlier lives, tombstones, the one parser of record
times, and the structural check of records read back from disk.

Writer and reader agree on every limit: the builders cut what they are given to the limits below (and say
so), `problem()` refuses what is past them, and MAX_RECORD_BYTES is larger than the largest record the
builders can make (tests/unit/test_state_fuzz.py holds the two together).

Schema 2 adds, per life, what proves it alive or dead (docs/how-it-works.md, "Evidence"): the namespace's change time
beside its device and inode, the identity of the directory the netns path is in, the host (boot, machine,
network namespace), the host side of the veth pair, and per address the identity of its host-local
reservation; per record the settings it is to be cleaned with. Schema 1 records (cni-reaper 0.2) are read
and carried as they are: what they lack is null, and the judgement treats null as "not known".
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Any

    Record = dict[str, Any]  # the JSON document, see models.Record
    Life = dict[str, Any]  # one life of it (an "incarnation": what one ADD set up)

from cni_reaper import __version__
from cni_reaper.state.names import MAX_RECORD_BYTES  # noqa: F401 - the records' limit, beside the fields' own

SCHEMA = 2
SCHEMAS = (1, 2)  # what is read
MAX_EARLIER = 16
MAX_IPS = 16  # addresses recorded per life (an attachment has one or two)
MAX_PORTS = 1024  # port mappings recorded per life (only informational: DNAT rules are found by their tag)
MAX_ARGS = 64  # CNI_ARGS pairs (the shell reads no more)
MAX_ARG_KEY, MAX_ARG_VALUE = 256, 4096
MAX_TEXT = 4096  # a path or name recorded (CNI_NETNS: the shell takes no longer one)
MAX_DIR = 1024  # a data dir recorded (a configured path: conf.MAX_PATH)
MAX_HOST = 256  # a boot id or machine id (36 and 32 characters)
MAX_LINK = 15  # a link name (IFNAMSIZ - 1)
# MAX_RECORD_BYTES (state/names.py) is larger than any record the limits above allow


# -- times (ISO 8601 UTC, microseconds; no datetime import on the hot path) ---------------------------
_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_ZONES = ("", "Z", "+00:00", "-00:00")


def iso_now() -> str:
    return iso_at(time.time())


def iso_at(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1e6):06d}Z"


def parse_time(text: Any) -> float:
    """Seconds since the epoch of YYYY-MM-DDTHH:MM:SS[.f{1,6}] in UTC (Z, +00:00, -00:00 or no zone), as
    iso_now() and pydantic write it. The one parser of record times: the check of a record read back
    (`problem`) and every reader use it, so a time the check lets through is a time every reader reads.
    ValueError otherwise (checked by hand: `re` costs milliseconds to import)."""
    if not isinstance(text, str) or len(text) < 19 or not text.isascii():
        raise _not_a_time(text)
    y, mo, d, h, mi, sec = _clock(text)
    fraction = _fraction(text)
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    if not (y > 0 and 1 <= mo <= 12 and 1 <= d <= (_DAYS[mo - 1] if mo != 2 or leap else 28) and h < 24
            and mi < 60 and sec < 60):
        raise ValueError(f"not a date: {text!r}"[:120])
    return _days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec + fraction


def _not_a_time(text: Any) -> ValueError:
    return ValueError(f"not a record time: {text!r}"[:120])


def _clock(v: str) -> tuple[int, ...]:
    """Year, month, day, hour, minute, second of YYYY-MM-DDTHH:MM:SS (ValueError when it has not that shape)."""
    if v[4] != "-" or v[7] != "-" or v[10] != "T" or v[13] != ":" or v[16] != ":":
        raise _not_a_time(v)
    fields = (v[0:4], v[5:7], v[8:10], v[11:13], v[14:16], v[17:19])
    if not all(f.isdigit() for f in fields):
        raise _not_a_time(v)
    return tuple(int(f) for f in fields)


def _fraction(v: str) -> float:
    """The fraction of a second after the seconds (.f{1,6}, or none), the zone after it being UTC's."""
    tail, fraction = v[19:], 0.0
    if tail.startswith("."):
        n = 1
        while n < len(tail) and tail[n].isdigit():
            n += 1
        if not 2 <= n <= 7:
            raise _not_a_time(v)
        fraction, tail = float(tail[:n]), tail[n:]
    if tail not in _ZONES:
        raise ValueError(f"record times are UTC: {v!r}"[:120])
    return fraction


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _time_ok(v: Any) -> bool:
    try:
        parse_time(v)
        return True
    except ValueError:
        return False


# -- building -----------------------------------------------------------------------------------------
def life(netns_path: str, observed: dict[str, Any], ips: list[dict[str, Any]], port_mappings: list[dict[str, Any]],
         warnings: list[str] | None = None) -> Life:
    """One life as an ADD (or an adopting CHECK) records it. `observed`: what reap/probes.observe_life found
    (netnsId, netnsDir, host, veth; each None when not known); `ips` carry their `reservation` (or None).
    What is past a limit is cut, with a warning."""
    warn = warnings if warnings is not None else []
    observed = _bounded(observed)
    ips = [dict(ip, reservation=_bounded_reservation(ip.get("reservation"))) for ip in ips]
    if len(ips) > MAX_IPS:
        warn.append(f"{len(ips)} addresses: only the first {MAX_IPS} recorded")
    if len(port_mappings) > MAX_PORTS:
        warn.append(f"{len(port_mappings)} port mappings: only the first {MAX_PORTS} recorded (DNAT rules are "
                    "found by their owner tag anyway)")
    return {
        "netns": netns_path,
        "netnsId": observed.get("netnsId"),
        "netnsDir": observed.get("netnsDir"),
        "host": observed.get("host"),
        "veth": observed.get("veth"),
        "ips": [dict(ip, reservation=ip.get("reservation")) for ip in ips[:MAX_IPS]],
        "portMappings": port_mappings[:MAX_PORTS],
        "createdAt": iso_now(),
    }


def _bounded(observed: dict[str, Any]) -> dict[str, Any]:
    """Evidence past its limits is not kept (it is read from the kernel and the file system, which make none)."""
    out = dict(observed)
    host, veth, d = out.get("host"), out.get("veth"), out.get("netnsDir")
    if host is not None and (len(host["boot"]) > MAX_HOST or len(host["machine"]) > MAX_HOST):
        out["host"] = None
    if veth is not None and len(veth["name"]) > MAX_LINK:
        out["veth"] = None
    if d is not None and len(d["groups"]) > 8:
        out["netnsDir"] = dict(d, groups=d["groups"][:8])
    return out


def _bounded_reservation(r: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if r is None or len(r["dataDir"]) > MAX_DIR else r


def settings(ipam_data_dir: str, cni_cache_dir: str, backend: str) -> dict[str, str]:
    """The settings a record is cleaned with, whichever network's verb runs the sweep."""
    return {"ipamDataDir": ipam_data_dir, "cniCacheDir": cni_cache_dir, "backend": backend}


def _ip_set(life: Life) -> list:
    return sorted((ip["address"], ip["prefix"], ip["family"]) for ip in life["ips"])


def _ns_key(life: Life) -> tuple | None:
    n = life.get("netnsId")
    return (n["dev"], n["ino"], n.get("ctime")) if n else None


def same_life(a: Life, b: Life) -> bool:
    """Two lives are the same when netns path, namespace (device, inode and, where known, its change time)
    and IPs agree (ports may be re-sent; a reservation may have been recorded on one and not the other)."""
    if a["netns"] != b["netns"] or _ip_set(a) != _ip_set(b):
        return False
    ka, kb = _ns_key(a), _ns_key(b)
    if ka is None or kb is None:
        return ka == kb
    return ka[:2] == kb[:2] and (ka[2] is None or kb[2] is None or ka[2] == kb[2])


def _clip_args(cni_args: dict[str, str]) -> dict[str, str]:
    out = {}
    for k, v in list(cni_args.items())[:MAX_ARGS]:
        if len(k) <= MAX_ARG_KEY and len(v) <= MAX_ARG_VALUE:
            out[k] = v
    return out


def merge(existing: Record | None, network: str, container_id: str, ifname: str, current: Life,
          cni_args: dict[str, str], conf_settings: dict[str, str]) -> tuple[Record, bool]:
    """The record after an ADD (or an adopting CHECK). Returns (record, an earlier life was kept)."""
    earlier: list[Life] = []
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
        "cniArgs": _clip_args(cni_args),
        "settings": conf_settings,
        "pluginVersion": __version__,
        "deleted": None,
    }, kept


def tombstone(netns_gone: bool, had_prev_result: bool, had_port_mappings: bool, verify: bool,
              cached: bool | None) -> dict[str, Any]:
    """What DEL knew when it ran. `verify`: whether a sweep must look at the tables once the DEL is over (a
    DEL that the downstream plugins could do whole needs no look). `cached`: whether libcni's cache held
    this attachment when DEL ran (None: not known). Only an entry that was there and is gone proves that
    the whole chain's DEL succeeded: libcni deletes it then, and only then."""
    return {"at": iso_now(), "netnsGone": netns_gone, "hadPrevResult": had_prev_result,
            "hadPortMappings": had_port_mappings, "verify": verify, "cached": cached}


def left(why: str) -> dict[str, Any]:
    """A dead attachment's leftovers that no sweep may take (nothing shows they are not a new life's, or
    another attachment's: docs/how-it-works.md, "Evidence"): they wait for the runtime's DEL or GC, and why."""
    return {"at": iso_now(), "why": why[:MAX_TEXT]}


HELD_FIRST_SECONDS = 60.0  # the first look again at what something not ours holds; doubled each time after
HELD_MAX_SECONDS = 3600.0  # and never later than this from now (a retry time further off is taken as due)
HELD_MAX_TRIES = 1 << 30


def held(why: str, record: Record) -> dict[str, Any]:
    """A dead attachment's leftover that something not ours holds (a rule of someone else's jumps to its
    chain, a rule without its tag is in it): the record stays, and a verb's sweep looks at it again once
    `retryAt` has passed (an operator's sweep and GC at once); `tries`: the clean-ups that found it held."""
    before = record.get("left") or {}
    tries = min(before.get("tries", 0) + 1, HELD_MAX_TRIES) if "retryAt" in before else 1
    wait = min(HELD_FIRST_SECONDS * 2 ** min(tries - 1, 16), HELD_MAX_SECONDS)
    return {"at": iso_now(), "why": why[:MAX_TEXT], "retryAt": iso_at(time.time() + wait), "tries": tries}


def left_mark(record: Record) -> bool | float:
    """What a record's `left` says to a judgement: False (nothing), True (left for the runtime's DEL or GC), or
    the time after which a sweep looks at what is held again (held())."""
    mark = record.get("left")
    if mark is None:
        return False
    return parse_time(mark["retryAt"]) if "retryAt" in mark else True


def reservation_dir(life: Life) -> str:
    """The data dir host-local reserved a life's first reserved address in ("" none: another IPAM)."""
    for ip in life["ips"]:
        if ip.get("reservation"):
            return str(ip["reservation"]["dataDir"])
    return ""


def network_dir(records: list[Record], network: str) -> str:
    """Where host-local keeps `network`, as the newest life of its records that had an address reserved saw it
    ("" when none did)."""
    lives = sorted((life for r in records if r["network"] == network for life in (r["current"], *r["earlier"])),
                   key=lambda life: str(life.get("createdAt", "")), reverse=True)
    return next((d for d in map(reservation_dir, lives) if d), "")


def key(record: Record) -> tuple[str, str, str]:
    return (record["network"], record["containerID"], record["ifname"])


def ips(*lives: Life) -> set[str]:
    return {ip["address"] for life in lives for ip in life["ips"]}


def upgrade(data: Record) -> Record:
    """A schema 1 record (checked by problem()) in the shape of schema 2: what it lacks is null."""
    if data["schema"] == SCHEMA:
        return data
    out = dict(data, schema=SCHEMA, settings=None)
    out["current"] = _upgrade_life(data["current"])
    out["earlier"] = [_upgrade_life(x) for x in data["earlier"]]
    if data["deleted"] is not None:
        out["deleted"] = dict(data["deleted"], cached=None)
        out["deleted"].setdefault("verify", True)
    return out


def _upgrade_life(life: Life) -> Life:
    ns = life["netnsId"]
    return dict(life, netnsId=dict(ns, ctime=None) if ns else None, netnsDir=None, host=None, veth=None,
                ips=[dict(ip, reservation=None) for ip in life["ips"]])


# -- checking what was read back ----------------------------------------------------------------------
# models.Record is the schema; this says the same (tests/unit/test_schema.py holds the two together).
PROTOCOLS = ("tcp", "udp", "sctp")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(v: Any, limit: int = MAX_TEXT) -> bool:
    return isinstance(v, str) and len(v) <= limit


def _keys(d: Any, required: frozenset, optional: frozenset = frozenset()) -> bool:
    if not isinstance(d, dict):
        return False
    keys = d.keys()
    return keys == required or (keys >= required and keys <= required | optional)


def _ints(d: Any, names: frozenset) -> bool:
    return _keys(d, names) and all(_is_int(d[n]) for n in names)


_LIFE = {1: frozenset(("netns", "netnsId", "ips", "portMappings", "createdAt")),
         2: frozenset(("netns", "netnsId", "netnsDir", "host", "veth", "ips", "portMappings", "createdAt"))}
_NETNS_ID = frozenset(("dev", "ino"))
_NETNS_ID2 = frozenset(("dev", "ino", "ctime"))
_DIR_ID = frozenset(("dev", "ino", "groups"))
_HOST = frozenset(("boot", "machine", "netns", "mnt"))
_VETH = frozenset(("name", "ifindex"))
_IP = {1: frozenset(("address", "prefix", "family")), 2: frozenset(("address", "prefix", "family", "reservation"))}
_RESERVATION = frozenset(("dataDir", "dev", "ino", "mtime", "ctime"))
_PORT = frozenset(("hostPort", "containerPort", "protocol", "hostIP"))
_RECORD = {1: frozenset(("schema", "network", "containerID", "ifname", "current", "earlier", "cniArgs",
                         "pluginVersion", "deleted")),
           2: frozenset(("schema", "network", "containerID", "ifname", "current", "earlier", "cniArgs", "settings",
                         "pluginVersion", "deleted"))}
_RECORD_OPTIONAL = {1: frozenset(), 2: frozenset(("left",))}
_LEFT = frozenset(("at", "why"))
_LEFT_HELD = frozenset(("retryAt", "tries"))
_SETTINGS = frozenset(("ipamDataDir", "cniCacheDir", "backend"))
_TOMBSTONE = {1: frozenset(("at", "netnsGone", "hadPrevResult", "hadPortMappings")),
              2: frozenset(("at", "netnsGone", "hadPrevResult", "hadPortMappings", "verify", "cached"))}
_TOMBSTONE_OPTIONAL = {1: frozenset(("verify",)), 2: frozenset()}


def _netns_id_problem(ns: Any, schema: int) -> bool:
    if ns is None:
        return False
    if schema == 1:
        return not _ints(ns, _NETNS_ID)
    return not (_keys(ns, _NETNS_ID2) and _is_int(ns["dev"]) and _is_int(ns["ino"])
                and (ns["ctime"] is None or _is_int(ns["ctime"])))


def _evidence_problem(life: dict[str, Any]) -> bool:
    """Whether the schema 2 fields of a life are malformed."""
    d, host, veth = life["netnsDir"], life["host"], life["veth"]
    return ((d is not None and not _dir_ok(d)) or (host is not None and not _host_ok(host))
            or (veth is not None and not (_keys(veth, _VETH) and _text(veth["name"], MAX_LINK)
                                          and _is_int(veth["ifindex"]))))


def _dir_ok(d: Any) -> bool:
    return (_keys(d, _DIR_ID) and _is_int(d["dev"]) and _is_int(d["ino"]) and isinstance(d["groups"], list)
            and len(d["groups"]) <= 8 and all(_is_int(g) for g in d["groups"]))


def _host_ok(host: Any) -> bool:
    return (_keys(host, _HOST) and _text(host["boot"], MAX_HOST) and _text(host["machine"], MAX_HOST)
            and _is_int(host["netns"]) and _is_int(host["mnt"]))


def _ip_problem(ip: Any, schema: int) -> bool:
    if not (_keys(ip, _IP[schema]) and isinstance(ip["address"], str) and len(ip["address"]) <= 64
            and _is_int(ip["prefix"]) and 0 <= ip["prefix"] <= 128 and _is_int(ip["family"]) and ip["family"] in (4, 6)):
        return True
    r = ip.get("reservation")
    return r is not None and not (_keys(r, _RESERVATION) and _text(r["dataDir"], MAX_DIR)
                                  and all(_is_int(r[k]) for k in ("dev", "ino", "mtime", "ctime")))


def _port_ok(p: Any) -> bool:
    return (_keys(p, _PORT) and _is_int(p["hostPort"]) and 1 <= p["hostPort"] <= 65535 and _is_int(p["containerPort"])
            and 1 <= p["containerPort"] <= 65535 and p["protocol"] in PROTOCOLS and isinstance(p["hostIP"], str)
            and len(p["hostIP"]) <= 64)


def _life_problem(life: Any, schema: int) -> str | None:
    if not _keys(life, _LIFE[schema]):
        return "life: not an object with exactly the keys of its schema"
    if not _text(life["netns"]) or not _time_ok(life["createdAt"]):
        return "life: bad netns or createdAt"
    if _netns_id_problem(life["netnsId"], schema):
        return "life: bad netnsId"
    if schema == 2 and _evidence_problem(life):
        return "life: bad netnsDir, host or veth"
    if not isinstance(life["ips"], list) or len(life["ips"]) > MAX_IPS or any(_ip_problem(ip, schema) for ip in life["ips"]):
        return f"life: bad ips (at most {MAX_IPS})"
    ports = life["portMappings"]
    if not isinstance(ports, list) or len(ports) > MAX_PORTS or not all(_port_ok(p) for p in ports):
        return f"life: bad portMappings (at most {MAX_PORTS})"
    return None


def _head_problem(data: dict[str, Any], schema: int) -> str | None:
    if not all(_text(data[k]) for k in ("network", "containerID", "ifname", "pluginVersion")):
        return "network, containerID, ifname and pluginVersion must be strings"
    if not isinstance(data["earlier"], list) or len(data["earlier"]) > MAX_EARLIER:
        return f"earlier must be a list of at most {MAX_EARLIER} lives"
    if not _args_ok(data["cniArgs"]):
        return "cniArgs must map strings to strings (within the limits)"
    if schema == 2:
        s = data["settings"]
        if s is not None and not (_keys(s, _SETTINGS) and all(_text(s[k]) for k in _SETTINGS)):
            return "bad settings"
    return None


def _args_ok(args: Any) -> bool:
    return isinstance(args, dict) and len(args) <= MAX_ARGS and all(
        isinstance(v, str) and len(k) <= MAX_ARG_KEY and len(v) <= MAX_ARG_VALUE for k, v in args.items())


def _tombstone_problem(dead: Any, schema: int) -> bool:
    if dead is None:
        return False
    if not (_keys(dead, _TOMBSTONE[schema], _TOMBSTONE_OPTIONAL[schema]) and _time_ok(dead["at"])):
        return True
    return not all(isinstance(v, bool) or (k == "cached" and v is None) for k, v in dead.items() if k != "at")


def _left_problem(left: Any) -> bool:
    if left is None:
        return False
    if not (_keys(left, _LEFT) or _keys(left, _LEFT | _LEFT_HELD)):
        return True
    if not (_time_ok(left["at"]) and _text(left["why"])):
        return True
    return "retryAt" in left and not (_time_ok(left["retryAt"]) and _is_int(left["tries"])
                                      and 1 <= left["tries"] <= HELD_MAX_TRIES)


def problem(data: Any) -> str | None:
    """Why `data` is not a record (None when it is one): what models.Record (schema 2) and models.RecordV1 say,
    in plain Python."""
    if not isinstance(data, dict) or not _is_int(data.get("schema")) or data["schema"] not in SCHEMAS:
        return f"not a record of schema {' or '.join(map(str, SCHEMAS))}"
    schema = data["schema"]
    if not _keys(data, _RECORD[schema], _RECORD_OPTIONAL[schema]):
        return "not an object with exactly the record's keys"
    if _left_problem(data.get("left")):
        return "bad left"
    head = _head_problem(data, schema)
    if head:
        return head
    for life in [data["current"], *data["earlier"]]:
        err = _life_problem(life, schema)
        if err:
            return err
    if _tombstone_problem(data["deleted"], schema):
        return "bad tombstone"
    return None
