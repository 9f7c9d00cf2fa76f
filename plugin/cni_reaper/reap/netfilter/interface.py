"""The one small interface every netfilter backend offers, and its errors."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from cni_reaper.reap.netfilter.iptables.rules import Op, Table
else:  # a plain class when run: `typing` is not imported by a clean-up (cni_reaper/values.py)
    Protocol = object


class BackendError(Exception):
    """A read or a transaction failed; nothing of a failed transaction was applied."""


class LockHeld(BackendError):
    """Another process holds the xtables lock longer than we wait: give up for now, retry on a later call."""


class Backend(Protocol):
    flavour: str
    name: str

    def read(self, family: int) -> dict[str, Table]:
        """The nat and filter tables of one family (4 or 6)."""

    def apply(self, family: int, ops: list[Op]) -> None:
        """Apply the operations, one transaction per table (iptables-nft: the rules' one, then the chains');
        raise BackendError if a transaction failed: nothing of that one was applied, an earlier one of the
        same call may have been (the caller reads again what is left; the journal's intent has no `done`)."""
