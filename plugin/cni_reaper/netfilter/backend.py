"""The one small interface every netfilter backend offers, and the choice of backend."""

from __future__ import annotations

from typing import Protocol

from ..plan import Op
from .rules import Table


class BackendError(Exception):
    pass


class LockHeld(BackendError):
    """Another process holds the xtables lock longer than we wait: give up for now, retry on a later call."""


class Backend(Protocol):
    flavour: str
    name: str

    def read(self, family: int) -> dict[str, Table]:
        """The nat and filter tables of one family (4 or 6)."""

    def apply(self, family: int, ops: list[Op]) -> None:
        """Apply the operations, one transaction per table; raise BackendError if a transaction failed
        (then nothing of that table's transaction was applied)."""


def select(backend: str = "auto", family: int = 4) -> Backend:
    """The backend for one family's tables: the flavour its tool on PATH uses, unless `backend` says which."""
    from .. import flavour as flavours
    from .restore import SaveRestoreBackend

    found, why = flavours.detect(backend, family=family)
    if found is None:
        raise BackendError(why)
    if found == "legacy":
        from . import iptc_backend

        if iptc_backend.available():
            return iptc_backend.IptcBackend()
    return SaveRestoreBackend(found)
