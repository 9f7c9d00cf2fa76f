"""Netfilter: the package's own types (rules.py), the reference plugins' chain names (chains.py), the backend
interface (interface.py) and the backends that read the tables and apply deletions (restore.py for
iptables-{nft,legacy}-save/-restore, iptc_backend.py for python-iptables on legacy). `select` picks one.

Backends are imported only when selected: the hot path imports none of this.
"""

from __future__ import annotations

from .interface import Backend, BackendError, LockHeld
from .rules import Op, Rule, Table

__all__ = ["Backend", "BackendError", "LockHeld", "Op", "Rule", "Table", "select"]


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
