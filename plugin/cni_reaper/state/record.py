"""The attachment record: the one module that knows its layout on disk. Every other module sees a record, its
lives and their parts as the typed classes below (`Record`, `Life`, ...), read from a document by `of_document`
and written back by `Record.doc`; none reads a record by string key or by position
(tests/unit/test_record_model.py holds that, and holds the classes to their pydantic twins in models.py, the
one schema, field by field). Here too: building a record from what an ADD observed (reap/probes.py makes the
observations; this module only shapes them), keeping earlier lives, tombstones, the one parser of record
times, and the structural check of documents read back from disk (`problem`).

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
    from collections.abc import Iterable
    from typing import Any, TypeVar

    P = TypeVar("P", bound="Part")

from cni_reaper import __version__
from cni_reaper.state.names import MAX_RECORD_BYTES  # noqa: F401 - the records' limit, beside the fields' own
from cni_reaper.state.record_checks import FIELDS, KEYS, OPTIONAL, SLOTS, check_Record, check_RecordV1, check_RecordV2
from cni_reaper.state.times import iso_at, iso_now, parse_time
from cni_reaper.values import Key, Value

SCHEMA = 3  # the shape of every record in memory (models.Record), the latest schema read
SCHEMAS = (1, 2, 3)  # what is read
# The schema written. Adding a field is two releases (expand, then contract): this one reads schema 3 and writes 2,
# so that a rollback from the release that writes 3 to this one keeps every record (0.4.x moves aside a record
# of a schema it does not know, and reads 2 alone); the next one sets WRITTEN = SCHEMA. CONTRIBUTING.md says how.
WRITTEN = 2
_CHECKS = {1: check_RecordV1, 2: check_RecordV2, 3: check_Record}
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


# -- times: state/times.py (the one parser of record times) ------------------------------------------


# -- the typed model -----------------------------------------------------------------------------------
# A record as every other module sees it: slotted classes named as models.py names the schema's parts, whose
# slots and field tables are generated from the models (state/record_checks.py, by scripts/generate.py): a field is
# declared once, in its model. `of` reads a document that problem() accepted (and upgrade() brought to schema 3);
# `doc` gives the document back, key for key. tests/unit/test_record_model.py holds every class to its pydantic
# twin field by field, and no module but this one to a record's layout.
_PARTS: dict[str, Any] = {}  # class name -> class, as each is defined (a part's nested parts are defined first)


class Part(Value):
    __slots__ = ()
    # its field table, in the document's order: (slot, JSON key, how a value that is not None is read and
    # written: None as it is, a Part class for a nested object, Many(Part class) for a list of them)
    _fields: tuple[tuple[str, str, Any], ...] = ()
    # keys left out of the document when their value is None (one the schema lets be null or absent, as a
    # record's `left`: a null read is written back absent, which every reader takes alike)
    _optional: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The class's field table from the generated one of its name (record_checks.FIELDS, OPTIONAL)."""
        super().__init_subclass__(**kwargs)
        cls._fields = tuple((slot, key, _kind(kind)) for slot, key, kind in FIELDS[cls.__name__])
        cls._optional = OPTIONAL.get(cls.__name__, frozenset())
        _PARTS[cls.__name__] = cls

    @classmethod
    def of(cls: type[P], d: dict[str, Any]) -> P:
        new = object.__new__(cls)
        for slot, k, kind in cls._fields:
            v = d.get(k)
            if v is not None:
                v = kind.of(v) if kind is not None else _copied(v, tuple)
            object.__setattr__(new, slot, v)
        return new

    def doc(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for slot, k, kind in self._fields:
            v = getattr(self, slot)
            if v is not None:
                v = kind.doc_of(v) if kind is not None else _copied(v, list)
            elif k in self._optional:
                continue
            out[k] = v
        return out

    @staticmethod
    def doc_of(v: Part) -> dict[str, Any]:
        return v.doc()


def _copied(v: Any, sequence: Any) -> Any:
    """A plain value of a part, its lists made `sequence`s (tuples in a part, lists in a document) and its
    mappings copied: a part shares nothing with the document it was read from or written to."""
    t = type(v)
    return sequence(v) if t is list or t is tuple else dict(v) if t is dict else v


def _kind(name: str) -> Any:
    """How a field's value is read and written, from what record_checks.FIELDS says it holds."""
    if not name:
        return None
    return Many(_PARTS[name[1:-1]]) if name.startswith("[") else _PARTS[name]


class Many:
    """A field that is a list of parts (Part._fields)."""

    __slots__ = ("part",)

    def __init__(self, part: Any) -> None:
        self.part = part

    def of(self, v: list[Any]) -> tuple[Any, ...]:
        return tuple([self.part.of(x) for x in v])

    @staticmethod
    def doc_of(v: tuple[Part, ...]) -> list[dict[str, Any]]:
        return [x.doc() for x in v]


class NetnsId(Part):
    """A network namespace: device and inode of its nsfs file, and (for a bind-mounted one, whose inode stays
    while it is mounted) the inode's change time in ns (None: not known): the kernel recycles inode numbers."""

    __slots__ = SLOTS["NetnsId"]

    def __init__(self, dev: int, ino: int, ctime: int | None) -> None:
        self.dev, self.ino, self.ctime = dev, ino, ctime

    def same(self, other: NetnsId) -> bool:
        """The same namespace: device and inode agree, and the change time where both know it."""
        return (self.dev == other.dev and self.ino == other.ino
                and (self.ctime is None or other.ctime is None or self.ctime == other.ctime))


class DirId(Part):
    """The directory a netns path is in: device, inode, and the peer groups of the mount it is on."""

    __slots__ = SLOTS["DirId"]

    def __init__(self, dev: int, ino: int, groups: tuple[int, ...] = ()) -> None:
        self.dev, self.ino, self.groups = dev, ino, groups


class HostId(Part):
    """The host a life was recorded on: boot id, machine id, the network and mount namespaces the plugin ran in."""

    __slots__ = SLOTS["HostId"]

    def __init__(self, boot: str, machine: str, netns: int, mnt: int) -> None:
        self.boot, self.machine, self.netns, self.mnt = boot, machine, netns, mnt


class Veth(Part):
    """The host side of the container's veth pair: its name and index in the host's network namespace."""

    __slots__ = SLOTS["Veth"]

    def __init__(self, name: str, ifindex: int) -> None:
        self.name, self.ifindex = name, ifindex


class ReservationId(Part):
    """Where host-local reserved an address for a life, and the identity of that file (times in ns)."""

    __slots__ = SLOTS["ReservationId"]

    def __init__(self, data_dir: str, dev: int, ino: int, mtime: int, ctime: int) -> None:
        self.data_dir, self.dev, self.ino, self.mtime, self.ctime = data_dir, dev, ino, mtime, ctime


class RecordedIP(Part):
    __slots__ = SLOTS["RecordedIP"]

    def __init__(self, address: str, prefix: int, family: int, reservation: ReservationId | None = None) -> None:
        self.address, self.prefix, self.family, self.reservation = address, prefix, family, reservation

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefix}"


class RecordedPortMapping(Part):
    __slots__ = SLOTS["RecordedPortMapping"]

    def __init__(self, host_port: int, container_port: int, protocol: str, host_ip: str) -> None:
        self.host_port, self.container_port, self.protocol, self.host_ip = host_port, container_port, protocol, host_ip

    @property
    def text(self) -> str:
        return f"{self.host_port}->{self.container_port}/{self.protocol}"


class Life(Part):
    """One life of an attachment (what one ADD set up), with what proves it alive or dead (docs/how-it-works.md,
    "Evidence"); what is not known is None."""

    __slots__ = SLOTS["Life"]

    def __init__(self, netns: str, netns_id: NetnsId | None, netns_dir: DirId | None, host: HostId | None,
                 veth: Veth | None, ips: tuple[RecordedIP, ...], ports: tuple[RecordedPortMapping, ...],
                 created_at: str) -> None:
        self.netns, self.netns_id, self.netns_dir, self.host, self.veth = netns, netns_id, netns_dir, host, veth
        self.ips, self.port_mappings, self.created_at = ips, ports, created_at

    @property
    def addresses(self) -> set[str]:
        return {ip.address for ip in self.ips}

    @property
    def reserved(self) -> bool:
        """Whether host-local's reservation of an address of it was found when it was recorded."""
        return any(ip.reservation is not None for ip in self.ips)

    @property
    def created(self) -> float:
        return parse_time(self.created_at)


class Tombstone(Part):
    """Written by DEL: the attachment is being torn down; what DEL knew when it ran (tombstone())."""

    __slots__ = SLOTS["Tombstone"]

    def __init__(self, at: str, netns_gone: bool, had_prev_result: bool, had_port_mappings: bool, verify: bool,
                 cached: bool | None) -> None:
        self.at, self.netns_gone, self.verify, self.cached = at, netns_gone, verify, cached
        self.had_prev_result, self.had_port_mappings = had_prev_result, had_port_mappings


class Left(Part):
    """A dead attachment's leftovers that no sweep may take (left()), or that something not ours holds (held():
    with the time a sweep looks again and how often it found them held)."""

    __slots__ = SLOTS["Left"]

    def __init__(self, at: str, why: str, retry_at: str | None = None, tries: int | None = None) -> None:
        self.at, self.why, self.retry_at, self.tries = at, why, retry_at, tries

    @property
    def mark(self) -> bool | float:
        """What it says to a judgement: True (left for the runtime's DEL or GC), or the time after which a sweep
        looks at what is held again."""
        return True if self.retry_at is None else parse_time(self.retry_at)


class RecordSettings(Part):
    """The settings a record is cleaned with, whichever network's verb runs the sweep."""

    __slots__ = SLOTS["RecordSettings"]

    def __init__(self, ipam_data_dir: str, cni_cache_dir: str, backend: str) -> None:
        self.ipam_data_dir, self.cni_cache_dir, self.backend = ipam_data_dir, cni_cache_dir, backend

    @classmethod
    def of_conf(cls, conf: Any) -> RecordSettings:
        return cls(conf.ipamDataDir, conf.cniCacheDir, conf.backend)


class Record(Part):
    """All cni-reaper knows of one attachment (network, container ID, ifname): one file in stateDir."""

    __slots__ = SLOTS["Record"]

    def __init__(self, network: str, container_id: str, ifname: str, current: Life, earlier: tuple[Life, ...],
                 cni_args: dict[str, str], settings: RecordSettings | None, deleted: Tombstone | None = None,
                 left: Left | None = None, plugin_version: str = __version__, schema: int = SCHEMA,
                 written_by: str | None = None) -> None:
        self.schema, self.network, self.container_id, self.ifname = schema, network, container_id, ifname
        self.current, self.earlier, self.cni_args, self.settings = current, earlier, cni_args, settings
        self.plugin_version, self.deleted, self.left, self.written_by = plugin_version, deleted, left, written_by

    def written(self, stamped: bool = True) -> dict[str, Any]:
        """The document this release writes of it: schema WRITTEN (what an older schema does not hold left
        out), saying that this release wrote it (`stamped`; else, for the journal's copy, who wrote it last)."""
        d = self.doc()
        if stamped:
            d["writtenBy"] = __version__
        if WRITTEN == SCHEMA:
            return d
        keys = KEYS[f"RecordV{WRITTEN}"]
        return {k: WRITTEN if k == "schema" else v for k, v in d.items() if k in keys}

    @property
    def key(self) -> Key:
        return Key(self.network, self.container_id, self.ifname)

    @property
    def lives(self) -> tuple[Life, ...]:
        return (self.current, *self.earlier)

    @property
    def left_mark(self) -> bool | float:
        """What its `left` says to a judgement: False (nothing), else Left.mark."""
        return False if self.left is None else self.left.mark


# -- building -----------------------------------------------------------------------------------------
def life(observed: Life, ips: list[RecordedIP], ports: list[RecordedPortMapping], warnings: list[str] | None = None) -> Life:
    """One life as an ADD (or an adopting CHECK) records it: what reap/probes.observe_life found (the evidence,
    each part None when not known), its addresses (with their reservations) and port mappings. What is past a
    limit is cut, with a warning."""
    warn = warnings if warnings is not None else []
    if len(ips) > MAX_IPS:
        warn.append(f"{len(ips)} addresses: only the first {MAX_IPS} recorded")
    if len(ports) > MAX_PORTS:
        warn.append(f"{len(ports)} port mappings: only the first {MAX_PORTS} recorded (DNAT rules are "
                    "found by their owner tag anyway)")
    kept = tuple(ip if ip.reservation is None or len(ip.reservation.data_dir) <= MAX_DIR else ip.replace(reservation=None)
                 for ip in ips[:MAX_IPS])
    return Life(observed.netns, observed.netns_id, *_evidence_kept(observed), kept, tuple(ports[:MAX_PORTS]), iso_now())


def _evidence_kept(observed: Life) -> tuple[DirId | None, HostId | None, Veth | None]:
    """The netns directory, host and veth evidence of an observed life within the record's limits: what is past
    them is not kept (the kernel and the file system make none such); a directory's peer groups, the first 8."""
    host, veth, d = observed.host, observed.veth, observed.netns_dir
    if host is not None and (len(host.boot) > MAX_HOST or len(host.machine) > MAX_HOST):
        host = None
    if veth is not None and len(veth.name) > MAX_LINK:
        veth = None
    if d is not None and len(d.groups) > 8:
        d = DirId(d.dev, d.ino, d.groups[:8])
    return d, host, veth


def same_life(a: Life, b: Life) -> bool:
    """Two lives are the same when netns path, namespace (device, inode and, where known, its change time)
    and IPs agree (ports may be re-sent; a reservation may have been recorded on one and not the other)."""
    if a.netns != b.netns or _ip_set(a) != _ip_set(b):
        return False
    if a.netns_id is None or b.netns_id is None:
        return a.netns_id is b.netns_id
    return a.netns_id.same(b.netns_id)


def _ip_set(life: Life) -> list[tuple[str, int, int]]:
    return sorted((ip.address, ip.prefix, ip.family) for ip in life.ips)


def _clip_args(cni_args: dict[str, str]) -> dict[str, str]:
    out = {}
    for k, v in list(cni_args.items())[:MAX_ARGS]:
        if len(k) <= MAX_ARG_KEY and len(v) <= MAX_ARG_VALUE:
            out[k] = v
    return out


def merge(existing: Record | None, network: str, container_id: str, ifname: str, current: Life,
          cni_args: dict[str, str], settings: RecordSettings | None) -> tuple[Record, bool]:
    """The record after an ADD (or an adopting CHECK). Returns (record, an earlier life was kept)."""
    earlier: list[Life] = []
    kept = False
    if existing is not None:
        earlier = list(existing.earlier)
        old = existing.current
        if same_life(old, current) and existing.deleted is None:
            current = current.replace(created_at=old.created_at)
        elif old.addresses - current.addresses:
            # an earlier life whose addresses the new one does not hold: its rules are to be cleaned
            earlier.append(old)
            kept = True
    return Record(network, container_id, ifname, current, tuple(earlier[-MAX_EARLIER:]), _clip_args(cni_args),
                  settings), kept


def tombstone(netns_gone: bool, had_prev_result: bool, had_port_mappings: bool, verify: bool,
              cached: bool | None) -> Tombstone:
    """What DEL knew when it ran. `verify`: whether a sweep must look at the tables once the DEL is over (a
    DEL that the downstream plugins could do whole needs no look). `cached`: whether libcni's cache held
    this attachment when DEL ran (None: not known). Only an entry that was there and is gone proves that
    the whole chain's DEL succeeded: libcni deletes it then, and only then."""
    return Tombstone(iso_now(), netns_gone, had_prev_result, had_port_mappings, verify, cached)


def left(why: str) -> Left:
    """A dead attachment's leftovers that no sweep may take (nothing shows they are not a new life's, or
    another attachment's: docs/how-it-works.md, "Evidence"): they wait for the runtime's DEL or GC, and why."""
    return Left(iso_now(), why[:MAX_TEXT])


HELD_FIRST_SECONDS = 60.0  # the first look again at what something not ours holds; doubled each time after
HELD_MAX_SECONDS = 3600.0  # and never later than this from now (a retry time further off is taken as due)
HELD_MAX_TRIES = 1 << 30


def held(why: str, before: Left | None) -> Left:
    """A dead attachment's leftover that something not ours holds (a rule of someone else's jumps to its
    chain, a rule without its tag is in it): the record stays, and a verb's sweep looks at it again once
    `retry_at` has passed (an operator's sweep and GC at once); `tries`: the clean-ups that found it held
    (`before`: the record's mark until now)."""
    tries = min((before.tries or 0) + 1, HELD_MAX_TRIES) if before is not None and before.retry_at is not None else 1
    wait = min(HELD_FIRST_SECONDS * 2 ** min(tries - 1, 16), HELD_MAX_SECONDS)
    return Left(iso_now(), why[:MAX_TEXT], iso_at(time.time() + wait), tries)


def reservation_dir(life: Life) -> str:
    """The data dir host-local reserved a life's first reserved address in ("" none: another IPAM)."""
    return next((ip.reservation.data_dir for ip in life.ips if ip.reservation is not None), "")


def network_dir(records: Iterable[Record], network: str) -> str:
    """Where host-local keeps `network`, as the newest life of its records that had an address reserved saw it
    ("" when none did)."""
    lives = sorted((life for r in records if r.network == network for life in r.lives),
                   key=lambda life: life.created_at, reverse=True)
    return next((d for d in map(reservation_dir, lives) if d), "")


def ips(*lives: Life) -> set[str]:
    """The addresses of all these lives (Life.addresses of each)."""
    return set().union(*(life.addresses for life in lives))


def key_of(data: dict[str, Any]) -> Key:
    """The key of a record document problem() accepted (before it is read: its file must be named by it)."""
    return Key(data["network"], data["containerID"], data["ifname"])


def later_schema(data: Any) -> int | None:
    """The schema of a record document a later cni-reaper wrote (None: not one)."""
    schema = data.get("schema") if isinstance(data, dict) else None
    return schema if isinstance(schema, int) and _is_int(schema) and schema > SCHEMA else None


def of_later(data: dict[str, Any]) -> Record | None:
    """What this cni-reaper can tell of a record a later one wrote (a rollback: 0.5 -> 0.6 -> 0.5): its key and
    the addresses of its lives, never more (None: not even that). It is kept as it is on disk, judged unknown
    (its addresses protected), and never rewritten, cleaned or dropped here (judge/life.py: `unjudged`)."""
    named = (data.get(n) for n in ("network", "containerID", "ifname"))
    key = [k for k in named if isinstance(k, str) and 0 < len(k) <= MAX_TEXT]
    if len(key) != 3:
        return None
    earlier = data.get("earlier")
    lives = [data.get("current"), *(earlier if isinstance(earlier, list) else [])][:1 + MAX_EARLIER]
    current = _later_life(lives[0]) or Life("", None, None, None, None, (), (), iso_now())
    return Record(key[0], key[1], key[2], current, tuple(filter(None, map(_later_life, lives[1:]))), {}, None,
                  schema=data["schema"])


def _later_life(v: Any) -> Life | None:
    if not isinstance(v, dict):
        return None
    ips = []
    listed = v.get("ips")
    for ip in (listed if isinstance(listed, list) else [])[:MAX_IPS]:
        address = ip.get("address") if isinstance(ip, dict) else None
        if isinstance(address, str) and 0 < len(address) <= 64:
            family = 6 if ":" in address else 4
            ips.append(RecordedIP(address, 128 if family == 6 else 32, family))
    netns, created = v.get("netns"), v.get("createdAt")
    return Life(netns[:MAX_TEXT] if isinstance(netns, str) else "", None, None, None, None, tuple(ips), (),
                created if isinstance(created, str) else iso_now())


def written_as_read(data: dict[str, Any]) -> bool:
    """Whether a document problem() accepted is written back as it is (of the schema written: Record.written)."""
    return bool(data["schema"] == WRITTEN)


def of_document(data: dict[str, Any]) -> Record:
    """The record a document problem() accepted holds (one of schema 1 or 2 in the shape of schema 3: what it
    lacks is None)."""
    return Record.of(upgrade(data))


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A record document of schema 1 or 2 (checked by problem()) in the shape of schema 3: what it lacks is null."""
    if data["schema"] == SCHEMA:
        return data
    if data["schema"] == 2:
        return dict(data, schema=SCHEMA, writtenBy=None)
    out = dict(data, schema=SCHEMA, settings=None, writtenBy=None)
    out["current"] = _upgrade_life(data["current"])
    out["earlier"] = [_upgrade_life(x) for x in data["earlier"]]
    if data["deleted"] is not None:
        out["deleted"] = dict(data["deleted"], cached=None)
        out["deleted"].setdefault("verify", True)
    return out


def _upgrade_life(life: dict[str, Any]) -> dict[str, Any]:
    ns = life["netnsId"]
    return dict(life, netnsId=dict(ns, ctime=None) if ns else None, netnsDir=None, host=None, veth=None,
                ips=[dict(ip, reservation=None) for ip in life["ips"]])


# -- checking what was read back ----------------------------------------------------------------------
# models.Record (and RecordV1) is the schema: state/record_checks.py is generated from it (scripts/generate.py).
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def problem(data: Any) -> str | None:
    """Why `data` is not a record (None when it is one): what models.RECORDS say of its schema, through the checks
    generated from them (state/record_checks.py, with the classes' field tables)."""
    if not isinstance(data, dict) or not _is_int(data.get("schema")) or data["schema"] not in SCHEMAS:
        return f"not a record of schema {', '.join(map(str, SCHEMAS))}"
    where = _CHECKS[data["schema"]](data)
    return None if where is None else f"{where}: not as a record of schema {data['schema']} has it (models.py)"
