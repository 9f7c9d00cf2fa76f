"""CNI error codes (spec 1.1.0, section "Error") and the one exception type the shell turns into error JSON."""

from __future__ import annotations

INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODE_FAILURE = 6
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11
STATUS_NOT_AVAILABLE = 50
STATUS_LIMITED = 51
INTERNAL = 999  # what skel reports for an error that is not a CNI error: only for a bug in cni-reaper


class CniError(Exception):
    """A failure the runtime (and the operator reading its log) should see as a CNI error result."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_json(self, cni_version: str) -> dict:
        out = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out
