"""The schema: pydantic models of the plugin configuration, prevResult (all supported versions) and the
record file. They are the source of truth for what cni-reaper accepts and writes.

The verbs do not import pydantic (loading pydantic-core's extension alone costs ≈ 35 ms here, most of an
ADD's budget): conf.py, result.py and record.py implement the same rules in plain Python, and
tests/unit/test_schema.py checks with generated documents that both sides accept and refuse the same
inputs and produce the same values, and that every record the verbs write validates against `Record`.
The CLI and the tests use these models directly.
"""

from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .conf import DEFAULT_CNI_CACHE_DIR, DEFAULT_IPAM_DATA_DIR, DEFAULT_LOG_FILE, DEFAULT_STATE_DIR

RECORD_SCHEMA = 1
MAX_EARLIER_INCARNATIONS = 16


def _absolute_path(value: str, key: str) -> str:
    if not value.startswith("/") or "\0" in value or len(value) > 1024:
        raise ValueError(f"{key} must be an absolute path")
    return value


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if "%" in text:
        raise ValueError(f"{text!r}: scoped addresses are not used in CNI results")
    return ipaddress.ip_address(text)


class PortMapping(BaseModel):
    """One entry of runtimeConfig.portMappings (the portMappings capability)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    hostPort: int = Field(ge=1, le=65535)
    containerPort: int = Field(ge=1, le=65535)
    protocol: Literal["tcp", "udp", "sctp"] = "tcp"
    hostIP: str = ""

    @model_validator(mode="before")
    @classmethod
    def _go_keys(cls, v: Any) -> Any:
        """Go decodes JSON keys case-insensitively, and go-cni (containerd, Nomad) sends untagged struct
        fields: {"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}. Accept both."""
        if isinstance(v, dict):
            canon = {k.lower(): k for k in ("hostPort", "containerPort", "protocol", "hostIP")}
            return {canon.get(k.lower(), k) if isinstance(k, str) else k: val for k, val in v.items()}
        return v

    @field_validator("protocol", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("hostIP")
    @classmethod
    def _host_ip(cls, v: str) -> str:
        if v:
            _ip(v)
        return v


class RuntimeConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    portMappings: list[PortMapping] = Field(default_factory=list, max_length=65535)


class PluginConf(BaseModel):
    """The configuration a runtime hands this plugin on stdin (one entry of the conflist, completed by libcni)."""

    model_config = ConfigDict(extra="allow", strict=True)

    cniVersion: str | None = None
    cniVersions: list[str] | None = None
    name: str
    type: str = ""
    stateDir: str = DEFAULT_STATE_DIR
    ipamDataDir: str = DEFAULT_IPAM_DATA_DIR
    cniCacheDir: str = DEFAULT_CNI_CACHE_DIR
    backend: Literal["auto", "nft", "legacy"] = "auto"
    lockTimeout: float = Field(default=10.0, gt=0, le=300, allow_inf_nan=False)
    logFile: str = DEFAULT_LOG_FILE
    prevResult: dict[str, Any] | None = None
    runtimeConfig: RuntimeConfig = Field(default_factory=RuntimeConfig)

    @field_validator("stateDir", "ipamDataDir", "cniCacheDir")
    @classmethod
    def _paths(cls, v: str, info) -> str:
        return _absolute_path(v, info.field_name)

    @field_validator("logFile")
    @classmethod
    def _log_path(cls, v: str) -> str:
        return _absolute_path(v, "logFile") if v else v


class ResultIP(BaseModel):
    """An entry of a result's `ips`: 0.3.x/0.4.0 carry `version`, 1.x do not."""

    model_config = ConfigDict(extra="allow", strict=True)

    address: str
    version: Literal["4", "6"] | None = None
    gateway: str | None = None
    interface: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "ResultIP":
        if "/" not in self.address:
            raise ValueError(f"address {self.address!r} must be in CIDR notation")
        addr, _, prefix = self.address.partition("/")
        ip = _ip(addr)
        if not (prefix.isascii() and prefix.isdigit()) or len(prefix) > 3 or int(prefix) > ip.max_prefixlen:
            raise ValueError(f"address {self.address!r} has an invalid prefix length")
        if self.version is not None and self.version != str(ip.version):
            raise ValueError(f"address {self.address} is not IPv{self.version}")
        if self.gateway:
            _ip(self.gateway)
        return self


class ResultInterface(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: str
    mac: str = ""
    sandbox: str = ""


class PrevResult(BaseModel):
    """The parts of a CNI result (0.3.0 to 1.1.0) this plugin reads; everything else is passed through untouched."""

    model_config = ConfigDict(extra="allow", strict=True)

    cniVersion: str | None = None
    interfaces: list[ResultInterface] = Field(default_factory=list)
    ips: list[ResultIP] = Field(default_factory=list)

    @model_validator(mode="after")
    def _indices(self) -> "PrevResult":
        for ip in self.ips:
            if ip.interface is not None and ip.interface >= len(self.interfaces):
                raise ValueError(f"ips entry {ip.address} names interface {ip.interface}, which does not exist")
        return self


class NetnsId(BaseModel):
    """Identity of a network namespace: device and inode of its nsfs file."""

    model_config = ConfigDict(extra="forbid", strict=True)

    dev: int
    ino: int


class RecordedIP(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    address: str
    prefix: int = Field(ge=0, le=128)
    family: Literal[4, 6]


class Incarnation(BaseModel):
    """One life of an attachment: what one ADD set up."""

    model_config = ConfigDict(extra="forbid", strict=True)

    netns: str
    netnsId: NetnsId | None = None
    ips: list[RecordedIP] = Field(default_factory=list)
    portMappings: list[PortMapping] = Field(default_factory=list)
    createdAt: datetime


class Tombstone(BaseModel):
    """Written by DEL: the attachment is being torn down; what DEL knew when it ran."""

    model_config = ConfigDict(extra="forbid", strict=True)

    at: datetime
    netnsGone: bool
    hadPrevResult: bool
    hadPortMappings: bool
    verify: bool = True


class Record(BaseModel):
    """All cni-reaper knows of one attachment (network name, container ID, ifname): one file in stateDir."""

    model_config = ConfigDict(extra="forbid", strict=True)

    schema_: Literal[1] = Field(default=RECORD_SCHEMA, alias="schema")
    network: str
    containerID: str
    ifname: str
    current: Incarnation
    earlier: list[Incarnation] = Field(default_factory=list, max_length=MAX_EARLIER_INCARNATIONS)
    cniArgs: dict[str, str] = Field(default_factory=dict)
    pluginVersion: str
    deleted: Tombstone | None = None
