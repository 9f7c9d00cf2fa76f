"""The command line's JSON documents (`list`, `journal`, `sweep`, `undo`, `doctor` with `--json`): their models,
part of the one schema; each document is checked against its model before it is printed (tools/printed.py, by
the core schemas scripts/generate.py derives from these models), so that what a command prints is what its
schema says. Declared here, apart from models.py's record, journal and configuration. PUBLISHED names
every schema published under docs/schemas/ (these and models.SCHEMAS; scripts/schemas.py writes them)."""

from typing import Any, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class _Output(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)


class ListedAttachment(_Output):
    """One record as `list --json` shows it."""

    network: str
    containerID: str
    ifname: str
    ips: List[str] = Field(description="the current life's addresses (CIDR)")
    ports: List[str] = Field(description="its port mappings, as HOSTPORT:PORT/PROTOCOL")
    netns: str
    state: str = Field(description="live, dead, unknown, torn down, ... (README, \"list\")")
    why: str = Field(description="the evidence of that state")
    earlierIPs: List[str] = Field(description="addresses of earlier lives of the same attachment")
    createdAt: str
    stateDir: str


class JournalEntry(_Output):
    """One removed item as `journal --json` shows it."""

    at: float = Field(description="when its clean-up began (seconds since the epoch)", allow_inf_nan=False)
    verb: str = Field(description="the CNI verb or command whose clean-up removed it")
    key: List[str] = Field(description="network, container ID, ifname")
    kind: Optional[str]
    what: str
    removed: Literal["yes", "perhaps (no done)"]
    undone: bool
    stateDir: str
    item: Dict[str, Any] = Field(description="the journal item as written (journal-item.schema.json)")


class SweepReport(_Output):
    """What `sweep --json` found or did."""

    applied: bool
    attachments: Dict[str, List[str]] = Field(description="\"network container-id [ifname]\" -> what it left")
    count: int
    errors: List[str]
    skipped: List[str]
    unknown: Dict[str, int] = Field(description="why attachments could not be judged -> how many")
    backends: Dict[str, str]
    held: Dict[str, str]
    observed: Dict[str, List[str]] = Field(description="what observe mode would remove")
    networks: List[str]


class Refused(_Output):
    item: str
    why: str


class UndoReport(_Output):
    """What `undo --json` put back, refused and cannot put back."""

    dryRun: bool
    restored: List[str]
    refused: List[Refused]
    cannotRestore: List[str]


class DoctorFinding(_Output):
    status: Literal["OK", "WARN", "FAIL"]
    check: str
    network: str
    message: str
    fix: str
    source: str


class DoctorReport(_Output):
    """What `doctor --json` found."""

    ok: bool
    findings: List[DoctorFinding]


OUTPUTS: Dict[str, Any] = {"list": List[ListedAttachment], "journal": List[JournalEntry], "sweep": SweepReport,
                           "undo": UndoReport, "doctor": DoctorReport}
# each command's document is checked against its model when it is printed (tools/printed.py), by the model's core
# schema (tools/output_checks.py, generated from OUTPUTS by scripts/generate.py): pydantic is not loaded for it


def published() -> Dict[str, Any]:
    """Every published document's model: the state's (models.SCHEMAS) and the commands' (OUTPUTS)."""
    from cni_reaper.models import SCHEMAS

    return {**SCHEMAS, **OUTPUTS}


def json_schema(name: str) -> Dict[str, Any]:
    """The JSON Schema of one published document."""
    from pydantic import TypeAdapter

    schema = TypeAdapter(published()[name]).json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"cni-reaper/{name}.schema.json",
            **schema}
