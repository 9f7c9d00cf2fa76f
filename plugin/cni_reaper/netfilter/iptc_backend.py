"""Backend for iptables-legacy through python-iptables (libiptc, in process).

python-iptables only sees legacy tables, so this backend is never used for nft. Reading is done with
`iptables-legacy-save` (the same parser as for nft, so ownership is decided identically); deletions are
applied in process, one libiptc commit per table with autocommit off, under the xtables lock. Under that
lock the table is read once more and every planned rule is checked at its position before anything is
deleted: if a concurrent writer changed the chain, nothing is committed and the caller re-plans.
"""

from __future__ import annotations

import glob
import os

from .interface import BackendError
from .restore import SaveRestoreBackend
from .rules import Op, Table, by_table
from .xtables_lock import xtables_lock


def _import_iptc():
    if "XTABLES_LIBDIR" not in os.environ:  # spares python-iptables an `ldconfig` run at import
        found = [d for d in glob.glob("/usr/lib/*/xtables") + ["/usr/lib/xtables", "/usr/lib64/xtables"]
                 if os.path.isdir(d)]
        if found:
            os.environ["XTABLES_LIBDIR"] = found[0]
    import iptc

    return iptc


def available() -> bool:
    try:
        _import_iptc()
        return True
    except Exception:  # noqa: BLE001 - missing libiptc or python-iptables: fall back to restore
        return False


class IptcBackend:
    flavour = "legacy"
    name = "python-iptables"

    def __init__(self) -> None:
        self._text = SaveRestoreBackend("legacy")

    def read(self, family: int) -> dict[str, Table]:
        return self._text.read(family)

    def apply(self, family: int, ops: list[Op]) -> None:
        iptc = _import_iptc()
        with xtables_lock():
            fresh = self._text.read(family)
            for name, table_ops in by_table(ops).items():
                self._commit(iptc, family, name, fresh.get(name), table_ops)

    def _commit(self, iptc, family: int, name: str, fresh: Table | None, ops: list[Op]) -> None:
        """One libiptc transaction for one table. Rules are deleted by position (libiptc's delete_num_entry,
        bound by python-iptables): building python-iptables Rule objects costs ≈ 0.2 ms per rule of a chain,
        which made a sweep quadratic. Every position was checked against a save taken under the same lock."""
        if fresh is None:
            raise BackendError(f"table {name} vanished")
        positions: dict[str, set[int]] = {}
        for op in ops:
            if op.kind != "rule":
                continue
            rules = fresh.chains.get(op.chain, [])
            if op.index >= len(rules) or rules[op.index].spec != op.spec:
                raise BackendError(f"{name} {op.chain} changed since it was read")
            positions.setdefault(op.chain, set()).add(op.index)
        table = (iptc.Table6 if family == 6 else iptc.Table)(name)
        try:
            table.autocommit = False
            table.refresh()
            delete_num = table._iptc.iptc_delete_num_entry
            for chain, indexes in positions.items():
                for index in sorted(indexes, reverse=True):  # from the end, so the others keep their position
                    if not delete_num(chain.encode(), index, table._handle):
                        raise BackendError(f"libiptc ({name} {chain} #{index}): {table.strerror()}")
            for op in ops:
                if op.kind == "chain" and op.chain in fresh.chains and table.is_chain(op.chain):
                    table.flush_entries(op.chain)
                    table.delete_chain(op.chain)
            table.commit()
        except iptc.IPTCError as exc:
            raise BackendError(f"libiptc ({name}, ipv{family}): {exc}") from None
        finally:
            try:
                table.refresh()  # drop any uncommitted change from this handle
                table.autocommit = True
            except Exception:  # noqa: BLE001 - best effort: the transaction already failed or committed
                pass
