"""The schema: pydantic models of the plugin configuration, prevResult (all supported versions) and the
record file. They are the source of truth for what cni-reaper accepts and writes.

The verbs do not import pydantic (loading pydantic-core's extension alone costs ≈ 35 ms here, most of an
ADD's budget): scripts/generate.py makes from these models the record's checks and field tables
(state/record_checks.py) and the key tables of the plain readers of the conflist entry, prevResult and the
settings file (regions of cni/conf.py, cni/result.py, cni/settings_file.py: go_tables); the values' rules of
conf.py and result.py are held to the models by tests/unit/test_schema.py on generated documents. The CLI
and the tests use these models directly (doctor checks the settings file with SettingsFile).
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Dict, List, Literal, Optional, Tuple, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from cni_reaper.cni.conf import (
    DEFAULT_CNI_CACHE_DIR,
    DEFAULT_IPAM_DATA_DIR,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_LOG_FILE,
    DEFAULT_STATE_DIR,
    MAX_LOCK_TIMEOUT,
    MAX_PATH,
)
from cni_reaper.cni.result import OLD_VERSIONS
from cni_reaper.cni.settings_file import DEFAULT_WRAP_TIMEOUT, MAX_WRAP_TIMEOUT
from cni_reaper.gojson import pick
from cni_reaper.state.record import (
    HELD_MAX_TRIES,
    MAX_ARG_KEY,
    MAX_ARG_VALUE,
    MAX_ARGS,
    MAX_DIR,
    MAX_HOST,
    MAX_IPS,
    MAX_LINK,
    MAX_PORTS,
    MAX_TEXT,
)
from cni_reaper.state.record import MAX_EARLIER as MAX_EARLIER_INCARNATIONS

# These models run on Python 3.9 too (the release is built on Debian 11): typing's Optional/List, not `X | None`.


def _absolute_path(value: str, key: str) -> str:
    if not value.startswith("/") or "\0" in value or len(value) > MAX_PATH:
        raise ValueError(f"{key} must be an absolute path")
    return value


def _ip(text: str) -> Union[ipaddress.IPv4Address, ipaddress.IPv6Address]:
    if "%" in text:
        raise ValueError(f"{text!r}: scoped addresses are not used in CNI results")
    return ipaddress.ip_address(text)


GO_POINTER = {"goPointer": True}  # a field's json_schema_extra: a pointer (or net.IP, a slice) in the Go struct


def pointer(default: Any = None) -> Any:
    """A field a Go struct holds as a pointer (or a slice that is no list here, as net.IP): a later null resets
    it, as it resets a list or a map."""
    return Field(default, json_schema_extra={"goPointer": True})


def go_tables(model: type[BaseModel]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(its fields, those a later null resets: lists, maps and pointers) of a model of a Go struct, as
    gojson.pick takes them. The plain readers' tables (cni/conf.py, cni/result.py, cni/settings_file.py) are
    generated from them (scripts/generate.py)."""
    fields = tuple(f.alias or n for n, f in model.model_fields.items())
    resettable = tuple(f.alias or n for n, f in model.model_fields.items()
                       if f.json_schema_extra == GO_POINTER or _origin(f.annotation) in (list, dict))
    return fields, resettable


def _origin(annotation: Any) -> Any:
    """list or dict for List[...]/Dict[...], also under Optional; else whatever typing says."""
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is Union and len(args) == 1:
        annotation = args[0]
    return typing.get_origin(annotation)


class GoStruct(BaseModel):
    """A model of an object the reference plugins decode into a Go struct: before validation, its keys are
    matched to the fields as Go's encoding/json matches them (gojson.pick). `go_fields` names the fields,
    `go_resettable` those of slice, map or pointer type (a later null resets them): both read off the model's
    own fields (go_tables)."""

    go_fields: ClassVar[Tuple[str, ...]] = ()
    go_resettable: ClassVar[Tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.go_fields, cls.go_resettable = go_tables(cls)

    @model_validator(mode="before")
    @classmethod
    def _go_keys(cls, v: Any) -> Any:
        return pick(v, cls.go_fields, cls.go_resettable) if isinstance(v, dict) else v


class PortMapping(GoStruct):
    """One entry of runtimeConfig.portMappings (the portMappings capability), usable as a port mapping.
    go-cni (containerd, Nomad) sends untagged struct fields ("HostPort", ...): keys match in any case."""

    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)

    hostPort: int = Field(ge=1, le=65535)
    containerPort: int = Field(ge=1, le=65535)
    protocol: Literal["tcp", "udp", "sctp"] = "tcp"
    hostIP: str = ""

    @field_validator("protocol", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return (v.lower() or "tcp") if isinstance(v, str) else v

    @field_validator("hostIP")
    @classmethod
    def _host_ip(cls, v: str) -> str:
        if v:
            _ip(v)
        return v


def _usable_entries(v: Any, handler: ValidatorFunctionWrapHandler) -> List[PortMapping]:
    """portMappings keeps the entries that are port mappings; anything else is skipped (conf.port_mappings)."""
    if not isinstance(v, list):
        return []
    out = []
    for entry in v[:65535]:
        if entry is None:
            continue
        try:
            out.append(PortMapping.model_validate(entry))
        except ValidationError:
            continue
    return out


class RuntimeConfig(GoStruct):
    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)

    portMappings: List[PortMapping] = Field(default_factory=list)

    @field_validator("portMappings", mode="wrap")
    @classmethod
    def _entries(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> List[PortMapping]:
        return _usable_entries(v, handler)


def _fallback(default: Any):
    """A wrap validator: a value of one of cni-reaper's own keys that is not usable gives the default."""

    def wrap(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(v)
        except (ValidationError, ValueError):
            return default

    return classmethod(wrap)


class ReaperKeys(GoStruct):
    """cni-reaper's own keys: of its conflist entry (PluginConf), and of the settings file of wrapped networks,
    at its top level and per network (SettingsFile). Decoded as Go decodes a struct's keys."""

    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)

    stateDir: str = DEFAULT_STATE_DIR
    ipamDataDir: str = DEFAULT_IPAM_DATA_DIR
    cniCacheDir: str = DEFAULT_CNI_CACHE_DIR
    backend: Literal["auto", "nft", "legacy"] = "auto"
    lockTimeout: float = Field(default=DEFAULT_LOCK_TIMEOUT, ge=0, le=MAX_LOCK_TIMEOUT, allow_inf_nan=False)
    logFile: str = DEFAULT_LOG_FILE
    mode: Literal["clean", "observe"] = "clean"

    @field_validator("stateDir", "ipamDataDir", "cniCacheDir")
    @classmethod
    def _paths(cls, v: str, info) -> str:
        return _absolute_path(v, info.field_name)

    @field_validator("logFile")
    @classmethod
    def _log_path(cls, v: str) -> str:
        return _absolute_path(v, "logFile") if v else v

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_case(cls, v: Any) -> Any:
        return (v.lower() or "auto") if isinstance(v, str) else v

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_case(cls, v: Any) -> Any:
        return (v.lower() or "clean") if isinstance(v, str) else v

    @field_validator("lockTimeout")
    @classmethod
    def _zero_is_default(cls, v: float) -> float:
        return v or DEFAULT_LOCK_TIMEOUT


class SettingsFile(ReaperKeys):
    """The settings file of wrapped networks (cni/settings_file.py; /etc/cni-reaper/config.json): cni-reaper's own
    keys at its top level and per network, where a bare run looks for the real plugins, and how long its own
    work may take in one wrapped call. Read on every wrapped call by the plain reader generated from it; checked
    whole by `cni-reaper doctor`."""

    cniPath: Optional[str] = None
    wrapTimeout: float = Field(default=DEFAULT_WRAP_TIMEOUT, gt=0, le=MAX_WRAP_TIMEOUT, allow_inf_nan=False)
    networks: Dict[str, ReaperKeys] = Field(default_factory=dict)


class PluginConf(ReaperKeys):
    """The configuration a runtime hands this plugin on stdin (one entry of the conflist, completed by libcni).
    Keys are decoded as Go decodes them; cni-reaper's own keys fall back to their defaults when unusable,
    except `name` and `stateDir` (see conf.py)."""

    cniVersion: Optional[str] = None
    cniVersions: Optional[List[str]] = None
    name: str = Field(min_length=1)
    type: str = ""
    prevResult: Optional[Dict[str, Any]] = None
    runtimeConfig: RuntimeConfig = Field(default_factory=RuntimeConfig)
    capabilities: Optional[Dict[str, Any]] = None

    # defined last, so that each wraps every other validator of its field
    _type = field_validator("type", mode="wrap")(_fallback(""))
    _version = field_validator("cniVersion", mode="wrap")(_fallback(None))
    _versions = field_validator("cniVersions", mode="wrap")(_fallback(None))
    _ipam = field_validator("ipamDataDir", mode="wrap")(_fallback(DEFAULT_IPAM_DATA_DIR))
    _cache = field_validator("cniCacheDir", mode="wrap")(_fallback(DEFAULT_CNI_CACHE_DIR))
    _log = field_validator("logFile", mode="wrap")(_fallback(DEFAULT_LOG_FILE))
    _mode = field_validator("mode", mode="wrap")(_fallback("observe"))
    _backend = field_validator("backend", mode="wrap")(_fallback("auto"))
    _timeout = field_validator("lockTimeout", mode="wrap")(_fallback(DEFAULT_LOCK_TIMEOUT))
    _runtime = field_validator("runtimeConfig", mode="wrap")(_fallback(RuntimeConfig()))
    _caps = field_validator("capabilities", mode="wrap")(_fallback(None))

    @property
    def portMappingsDeclared(self) -> bool:
        return isinstance(self.capabilities, dict) and self.capabilities.get("portMappings") is True


def _go_cidr(text: str) -> Union[ipaddress.IPv4Interface, ipaddress.IPv6Interface]:
    """What Go's net.ParseCIDR accepts: an address without zone, "/", a prefix of ASCII digits (leading zeros
    allowed) no longer than the address."""
    addr, sep, prefix = text.partition("/")
    if not sep or not prefix.isascii() or not prefix.isdigit():
        raise ValueError(f"address {text!r} must be in CIDR notation")
    ip = _ip(addr)
    if int(prefix) > ip.max_prefixlen:
        raise ValueError(f"address {text!r} has an invalid prefix length")
    return ipaddress.ip_interface(f"{ip}/{int(prefix)}")


class _IPConfig(GoStruct):
    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)

    gateway: Optional[str] = pointer()  # net.IP: a slice

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, v: Optional[str]) -> Optional[str]:
        if v:
            _ip(v)
        return v


class ResultIP(_IPConfig):
    """An entry of a result's `ips` (0.3.0 and later): 0.3.x/0.4.0 carry `version`, 1.x do not."""

    address: Optional[str] = None
    version: Optional[str] = None
    interface: Optional[int] = pointer()

    @field_validator("address")
    @classmethod
    def _address(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            _go_cidr(v)
        return v


class OldIPConfig(_IPConfig):
    """`ip4` / `ip6` of a 0.1.0 or 0.2.0 result."""

    ip: Optional[str] = None

    @field_validator("ip")
    @classmethod
    def _address(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            _go_cidr(v)
        return v


class ResultInterface(GoStruct):
    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)

    name: str = ""
    mac: str = ""
    sandbox: str = ""
    mtu: int = 0
    socketPath: str = ""
    pciID: str = ""


class PrevResult(GoStruct):
    """The parts of a CNI result (0.1.0 to 1.1.0) this plugin reads; everything else is passed through untouched.
    Which parts are read depends on the result's version: `ip4`/`ip6` up to 0.2.0, `ips` from 0.3.0."""

    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)

    cniVersion: Optional[str] = None
    interfaces: Optional[List[Optional[ResultInterface]]] = None
    ips: Optional[List[Optional[ResultIP]]] = None
    ip4: Optional[OldIPConfig] = pointer()
    ip6: Optional[OldIPConfig] = pointer()

    @classmethod
    def parse(cls, raw: Dict[str, Any], config_version: str) -> PrevResult:
        """Validate the parts that the result's version (or, when it names none, the config's) says are read."""
        decoded = pick(raw, cls.go_fields, cls.go_resettable)
        version = decoded.get("cniVersion") or config_version
        old = isinstance(version, str) and version in OLD_VERSIONS
        drop = ("interfaces", "ips") if old else ("ip4", "ip6")
        return cls.model_validate({k: v for k, v in decoded.items() if k not in drop})

    def addresses(self) -> List[Union[ipaddress.IPv4Interface, ipaddress.IPv6Interface]]:
        out = []
        configs = [self.ip4, self.ip6] if self.ips is None else self.ips
        for c in configs:
            text = getattr(c, "address", None) if isinstance(c, ResultIP) else getattr(c, "ip", None)
            if text is not None:
                iface = _go_cidr(text)
                if iface not in out:
                    out.append(iface)
        return out


class NetnsIdV1(BaseModel):
    """Identity of a network namespace as cni-reaper 0.2 recorded it: device and inode of its nsfs file."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    dev: int
    ino: int


class NetnsId(NetnsIdV1):
    """Identity of a network namespace: device and inode of its nsfs file, and (for a bind-mounted one, whose
    inode stays while it is mounted) the inode's change time in ns: the kernel recycles inode numbers."""

    ctime: Optional[int]


class DirId(BaseModel):
    """The directory a netns path is in: device, inode, and the peer groups of the mount it is on."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    dev: int
    ino: int
    groups: List[int] = Field(max_length=8)


class HostId(BaseModel):
    """The host a life was recorded on: boot id, machine id, the network and mount namespaces the plugin ran in."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    boot: str = Field(max_length=MAX_HOST)
    machine: str = Field(max_length=MAX_HOST)
    netns: int
    mnt: int


class Veth(BaseModel):
    """The host side of the container's veth pair: its name and index in the host's network namespace."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    name: str = Field(max_length=MAX_LINK)
    ifindex: int


class ReservationId(BaseModel):
    """Where host-local reserved an address for this life, and the identity of that file."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    dataDir: str = Field(max_length=MAX_DIR)
    dev: int
    ino: int
    mtime: int
    ctime: int


class RecordedIPV1(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    address: str = Field(max_length=64)
    prefix: int = Field(ge=0, le=128)
    family: Literal[4, 6]


class RecordedIP(RecordedIPV1):
    reservation: Optional[ReservationId]


class RecordedPortMapping(BaseModel):
    """A port mapping as a record keeps it: every field, the names spelled one way."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    hostPort: int = Field(ge=1, le=65535)
    containerPort: int = Field(ge=1, le=65535)
    protocol: Literal["tcp", "udp", "sctp"]
    hostIP: str = Field(max_length=64)


# Record times: ISO 8601, "T" between date and time, seconds, at most microseconds, UTC ("Z", "+00:00", "-00:00"
# or none).
_RECORD_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-]00:00)?")


def _record_time(v: Any) -> Any:
    if isinstance(v, datetime):
        return v
    if not isinstance(v, str) or not _RECORD_TIME.fullmatch(v):
        raise ValueError("record times are written as YYYY-MM-DDTHH:MM:SS[.ffffff]Z")
    return v


def _utc(v: datetime) -> datetime:
    """Times in records are UTC (written with Z); a naive time is read as UTC."""
    offset = v.utcoffset()
    if offset is not None and offset.total_seconds() != 0:
        raise ValueError("record times must be in UTC")
    return v


class LifeV1(BaseModel):
    """One life of an attachment (what one ADD set up), as cni-reaper 0.2 recorded it."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    netns: str = Field(max_length=MAX_TEXT)
    netnsId: Optional[NetnsIdV1]
    ips: List[RecordedIPV1] = Field(max_length=MAX_IPS)
    portMappings: List[RecordedPortMapping] = Field(max_length=MAX_PORTS)
    createdAt: datetime = Field(strict=False)  # a string of the format below, once _record_time has checked it

    _format = field_validator("createdAt", mode="before")(classmethod(lambda cls, v: _record_time(v)))
    _time = field_validator("createdAt")(classmethod(lambda cls, v: _utc(v)))


class Life(LifeV1):
    """One life of an attachment, with what proves it alive or dead (docs/how-it-works.md, "Evidence")."""

    netnsId: Optional[NetnsId]
    netnsDir: Optional[DirId]
    host: Optional[HostId]
    veth: Optional[Veth]
    ips: List[RecordedIP] = Field(max_length=MAX_IPS)  # type: ignore[assignment]


class TombstoneV1(BaseModel):
    """Written by DEL: the attachment is being torn down; what DEL knew when it ran."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    at: datetime = Field(strict=False)
    netnsGone: bool
    hadPrevResult: bool
    hadPortMappings: bool
    verify: bool = True

    _format = field_validator("at", mode="before")(classmethod(lambda cls, v: _record_time(v)))
    _time = field_validator("at")(classmethod(lambda cls, v: _utc(v)))


class Tombstone(TombstoneV1):
    verify: bool
    cached: Optional[bool]  # whether libcni cached the attachment when DEL ran (None: not known)


class RecordSettings(BaseModel):
    """The settings a record is cleaned with, whichever network's verb runs the sweep."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    ipamDataDir: str = Field(max_length=MAX_TEXT)
    cniCacheDir: str = Field(max_length=MAX_TEXT)
    backend: str = Field(max_length=MAX_TEXT)


def _strict_int(v: Any) -> Any:
    if type(v) is not int:  # strict Literal[1] takes True and 1.0 (both == 1): the record's schema is an integer
        raise ValueError("schema must be an integer")
    return v


# CNI_ARGS as a record keeps them: at most MAX_ARGS pairs, each key and value within its limit
CniArgs = Annotated[Dict[Annotated[str, Field(max_length=MAX_ARG_KEY)], Annotated[str, Field(max_length=MAX_ARG_VALUE)]],
                    Field(max_length=MAX_ARGS)]


class RecordV1(BaseModel):
    """A record of cni-reaper 0.2 (schema 1): still read, and carried as it is."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    schema_: Literal[1] = Field(alias="schema")
    _schema = field_validator("schema_", mode="before")(classmethod(lambda cls, v: _strict_int(v)))
    network: str = Field(max_length=MAX_TEXT)
    containerID: str = Field(max_length=MAX_TEXT)
    ifname: str = Field(max_length=MAX_TEXT)
    current: LifeV1
    earlier: List[LifeV1] = Field(max_length=MAX_EARLIER_INCARNATIONS)
    cniArgs: CniArgs
    pluginVersion: str = Field(max_length=MAX_TEXT)
    deleted: Optional[TombstoneV1]


class Left(BaseModel):
    """A dead attachment's leftovers that no sweep may take: they wait for the runtime's DEL or GC."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    at: datetime = Field(strict=False)
    why: str = Field(max_length=MAX_TEXT)

    _format = field_validator("at", mode="before")(classmethod(lambda cls, v: _record_time(v)))
    _time = field_validator("at")(classmethod(lambda cls, v: _utc(v)))


class Held(Left):
    """A dead attachment's leftover that something not ours holds: a sweep looks at it again after retryAt."""

    retryAt: datetime = Field(strict=False)
    tries: int = Field(ge=1, le=HELD_MAX_TRIES)

    _retry_format = field_validator("retryAt", mode="before")(classmethod(lambda cls, v: _record_time(v)))
    _retry_time = field_validator("retryAt")(classmethod(lambda cls, v: _utc(v)))
    _tries = field_validator("tries", mode="before")(classmethod(lambda cls, v: _strict_int(v)))


class RecordV2(BaseModel):
    """A record of cni-reaper 0.3 to 0.5 (schema 2), exactly as state/record.py writes it while its WRITTEN is
    2 (every key present; record.problem() says the same, through the checks generated from it)."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    schema_: Literal[2] = Field(alias="schema")
    _schema = field_validator("schema_", mode="before")(classmethod(lambda cls, v: _strict_int(v)))
    network: str = Field(max_length=MAX_TEXT)
    containerID: str = Field(max_length=MAX_TEXT)
    ifname: str = Field(max_length=MAX_TEXT)
    current: Life
    earlier: List[Life] = Field(max_length=MAX_EARLIER_INCARNATIONS)
    cniArgs: CniArgs
    settings: Optional[RecordSettings]
    pluginVersion: str = Field(max_length=MAX_TEXT)
    deleted: Optional[Tombstone]
    left: Optional[Union[Held, Left]] = None  # may be absent


class Record(RecordV2):
    """All cni-reaper knows of one attachment (network name, container ID, ifname): one file in stateDir, in
    schema 3, the shape every record has in memory (state/record.py's classes: a record of schema 1 or 2 is read
    into it, what it lacks None). This release reads schema 3 and writes schema 2 (state/record.py WRITTEN):
    the first half of adding a field, so that a rollback from the release that writes it keeps every record."""

    schema_: Literal[3] = Field(alias="schema")  # type: ignore[assignment]
    # the cni-reaper release that last wrote this record (None: one that did not say, a record of schema 1 or 2)
    writtenBy: Optional[str] = Field(max_length=MAX_TEXT)


RECORDS: Dict[int, Any] = {1: RecordV1, 2: RecordV2, 3: Record}


class IndexEntry(BaseModel):
    """One record's entry in its state directory's index (state/index.py): what the quick judgement and a
    sweep read of a record without reading it (index.Entry.of_record makes it), as a journal line and the index
    hold it: a list of these fields in this order, a tuple a list in JSON (in the whole index, `dir` and `host`
    are positions in its tables). The index names the fields in its first part: an index of other fields is
    another release's, made anew from the records. state/index.py's FIELDS and entry_ok are generated from it."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    ino: int  # the record file's inode
    network: str
    cid: str
    ifname: str
    netns: str
    ns: Optional[Tuple[int, int, Optional[int]]]  # NetnsId: (dev, ino, ctime)
    dir: Optional[Tuple[int, int, Tuple[int, ...]]]  # DirId: (dev, ino, peer groups)
    host: Optional[Tuple[str, str, int, int]]  # HostId: (boot, machine, netns, mnt)
    veth: Optional[Tuple[str, int]]  # Veth: (name, ifindex)
    deleted_at: Optional[float]  # its tombstone's time (seconds since the epoch)
    cached: Optional[bool]  # its tombstone's: whether libcni cached it when DEL ran
    verify: bool
    earlier: bool  # whether it holds earlier lives
    ips: List[str]  # its current life's addresses, sorted
    cache_dir: Optional[str]  # its settings' libcni cache directory
    # record.left_mark: its leftovers wait for the runtime's DEL or GC (true), or a sweep looks again after this time
    left: Union[bool, Annotated[float, Field(ge=0, lt=1 << 40)]]  # a record file's model by its schema


def record_problem(doc: Any) -> Optional[str]:
    """What the schema says of a record document of any schema read (None: it is one)."""
    import json

    schema = doc.get("schema") if isinstance(doc, dict) else None
    model = RECORDS.get(schema, Record) if type(schema) is int else Record
    try:
        model.model_validate_json(json.dumps(doc))
    except ValidationError as exc:
        return str(exc).splitlines()[0]
    return None


# -- the journal's items ------------------------------------------------------------------------------------
# What each clean-up writes to the journal before it removes anything (state/journal.py), one item per thing it
# removes, and what `journal --json` and `undo` read back. Undo puts nothing back of an item these models refuse
# (journal_item_problem), and never half of one. A later release's items may carry more keys: kept, not refused.
def _line(v: str) -> str:
    """One line of text (an item's rule, a path, a name: no newline, no NUL)."""
    if "\n" in v or "\r" in v or "\0" in v:
        raise ValueError("not one line")
    return v


def _absolute(v: str) -> str:
    if not _line(v).startswith("/"):
        raise ValueError("not an absolute path")
    return v


def _file_name(v: str) -> str:
    if v in ("", ".", "..") or "/" in _line(v):
        raise ValueError("not a file name")
    return v


def _address(v: str) -> str:
    from cni_reaper.cni.ipaddr import parse_ip

    parse_ip(v)  # ValueError: not an address
    return v


def _json_object_text(v: str) -> str:
    from cni_reaper import jsonio

    try:
        if isinstance(jsonio.loads(v), dict):
            return v
    except RecursionError:
        pass
    raise ValueError("not the text of a JSON object")


Line = Annotated[str, AfterValidator(_line)]
AbsolutePath = Annotated[str, AfterValidator(_absolute)]
FileName = Annotated[str, AfterValidator(_file_name)]


class _JournalItem(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)

    key: List[str] = Field(min_length=3, max_length=3,
                           description="the attachment it was removed for: network, container ID, ifname")
    what: Line = Field("", description="what it was, in words")


class IptablesItem(_JournalItem):
    """An iptables rule (op "rule": its spec and position) or a chain (op "chain": its rules) of the plugins."""

    kind: Literal["iptables"]
    family: Literal[4, 6]
    flavour: Literal["nft", "legacy"]
    table: FileName
    chain: Annotated[FileName, AfterValidator(lambda v: v if " " not in v else _not(v, "a chain name"))]
    op: Literal["rule", "chain"]
    spec: Optional[Line] = None
    index: Optional[int] = Field(None, ge=0)
    rules: Optional[List[Line]] = None

    @model_validator(mode="after")
    def _of_its_op(self) -> IptablesItem:
        if self.op == "chain" and self.rules is None:
            raise ValueError("rules is not a list of rules")
        if self.op == "rule" and self.spec is None:
            raise ValueError("spec is missing or not one line")
        return self


def _not(v: Any, what: str) -> Any:
    raise ValueError(f"not {what}")


class NftItem(_JournalItem):
    """A native nftables rule of plugins 1.6+, as nft printed it (JSON)."""

    kind: Literal["nft"]
    family: Line
    table: Line
    chain: Line
    rule: Dict[str, Any]


class ReservationItem(_JournalItem):
    """A host-local reservation file: its content, permission bits and modification time (ns)."""

    kind: Literal["reservation"]
    dataDir: AbsolutePath
    network: FileName
    ip: Annotated[str, AfterValidator(_address)]
    content: str
    mode: int = Field(0o600, ge=0, le=0o7777)
    mtime: Optional[int] = Field(None, ge=0)


class CacheItem(_JournalItem):
    """libcni's cached result of the attachment, as its file held it."""

    kind: Literal["cache"]
    cacheDir: AbsolutePath
    entry: FileName
    content: Annotated[str, AfterValidator(_json_object_text)]


class ConntrackItem(_JournalItem):
    """Conntrack entries of a dead address cleared (cannot be put back)."""

    kind: Literal["conntrack"]
    ip: str
    entries: int = Field(ge=0)


class NetnsItem(_JournalItem):
    """A network namespace mount removed on the scheduler's word (cannot be put back)."""

    kind: Literal["netns"]
    netns: AbsolutePath


class RecordItem(_JournalItem):
    """cni-reaper's record of the attachment, dropped once everything it held was verified gone."""

    kind: Literal["record"]
    record: Dict[str, Any]


JournalItem = Annotated[Union[IptablesItem, NftItem, ReservationItem, CacheItem, ConntrackItem, NetnsItem, RecordItem],
                        Field(discriminator="kind")]
_ADAPTERS: Dict[str, Any] = {}  # made once per process: a TypeAdapter builds its validator when made


def _adapter(name: str) -> Any:
    from pydantic import TypeAdapter

    if name not in _ADAPTERS:
        _ADAPTERS[name] = TypeAdapter(SCHEMAS[name] if name in SCHEMAS else NOMAD[name])
    return _ADAPTERS[name]


def journal_item_problem(item: Any) -> Optional[str]:
    """What is wrong with a journal item (None: nothing), in one line."""
    if not isinstance(item, dict) or item.get("kind") not in _ITEM_KINDS:
        return f"unknown kind {str(item.get('kind') if isinstance(item, dict) else item)[:40]!r}"
    try:
        _adapter("journal-item").validate_python(item)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"][1:])  # after the kind's tag
        msg = e["msg"].removeprefix("Value error, ")
        return f"{where}: {msg}" if where else msg
    return None


# -- the Nomad agent's answers (reap/scheduler.py, `sweep --nomad`) ----------------------------------------------
# Only what the scheduler's word reads, every other field ignored (a newer agent says more); a value of another
# type than Nomad's makes the whole answer prove nothing (ValidationError: the word is silent and says why).
class _NomadAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)


class NomadClientStats(_NomadAnswer):
    node_id: Optional[str] = None


class NomadAgentStats(_NomadAnswer):
    client: Optional[NomadClientStats] = None


class NomadClientConfig(_NomadAnswer):
    StateDir: Optional[str] = None


class NomadAgentConfig(_NomadAnswer):
    Client: Optional[NomadClientConfig] = None
    DataDir: Optional[str] = None


class NomadAgentSelf(_NomadAnswer):
    """`/v1/agent/self`: the client's node ID, and where its state directory is (its client-id file)."""

    stats: Optional[NomadAgentStats] = None
    config: Optional[NomadAgentConfig] = None

    @property
    def node_id(self) -> str:
        return (self.stats.client.node_id or "") if self.stats and self.stats.client else ""

    @property
    def state_dir(self) -> str:
        """The client's state directory as its configuration names it (its DataDir's client/ when it names none;
        "" when neither is named)."""
        c = self.config
        if c is not None and c.Client is not None and c.Client.StateDir:
            return c.Client.StateDir
        return f"{c.DataDir}/client" if c is not None and c.DataDir else ""


class NomadAllocation(_NomadAnswer):
    """One allocation of `/v1/node/<id>/allocations` (its stub)."""

    ID: str = Field(max_length=64)
    NodeID: str = Field(max_length=64)
    ClientStatus: str = Field(max_length=64)


NomadAllocations = List[NomadAllocation]


def nomad_answer(name: str, doc: Any) -> Any:
    """An answer of the Nomad agent read by its model ("agent-self": NomadAgentSelf; "allocations": a list of
    NomadAllocation); ValueError, in one line, when it is not one."""
    from pydantic import ValidationError

    try:
        return _adapter(name).validate_python(doc)
    except ValidationError as exc:
        errors = exc.errors()
        if not errors:
            raise ValueError("not as Nomad answers") from None
        where = ".".join(str(x) for x in errors[0]["loc"]) or "the answer"
        raise ValueError(f"{where}: {errors[0]['msg']}") from None


# The command line's JSON documents are declared with the commands that print them (tools/output.py: a command
# loads pydantic and those few models, not these); tools/output.PUBLISHED names every published schema.
NOMAD: Dict[str, Any] = {"agent-self": NomadAgentSelf, "allocations": NomadAllocations}
# the state's documents, published: a record file is of the schema written (2) or of the latest read (3)
SCHEMAS: Dict[str, Any] = {"record": Union[RecordV2, Record], "journal-item": JournalItem}


_ITEM_KINDS = ("iptables", "nft", "reservation", "cache", "conntrack", "netns", "record")
