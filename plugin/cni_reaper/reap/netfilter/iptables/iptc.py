"""Backend for iptables-legacy through python-iptables (libiptc, in process).

python-iptables only sees legacy tables, so this backend is never used for nft. Reading is done with
`iptables-legacy-save` (the same parser as for nft, so ownership is decided identically); deletions are
applied in process, one libiptc commit per table with autocommit off, under the xtables lock. Under that
lock the table is read once more and every planned rule is checked at its position before anything is
deleted: if a concurrent writer changed the chain, nothing is committed and the caller re-plans.
"""

from __future__ import annotations

import os
import sys

from cni_reaper.reap.netfilter.interface import BackendError
from cni_reaper.reap.netfilter.iptables.restore import SaveRestoreBackend
from cni_reaper.reap.netfilter.iptables.rules import Op, Table, by_table, puts_back
from cni_reaper.reap.netfilter.iptables.xtables_lock import xtables_lock

_LIB_DIRS = ("/lib/{arch}-linux-gnu", "/usr/lib/{arch}-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


def _lib_dirs() -> list[str]:
    arch = os.uname().machine
    return [d.format(arch=arch) for d in _LIB_DIRS if os.path.isdir(d.format(arch=arch))]


def find_library(name: str) -> str | None:
    """What ctypes.util.find_library answers, found by listing the library directories: python-iptables asks
    it for libip4tc, libip6tc, libxtables and libc, and ctypes would run `ldconfig -p` and `gcc` (which a
    Nomad client may not have) for each question."""
    prefix = f"lib{name}.so."
    for d in _lib_dirs():
        # the soname (libc.so.6, libip4tc.so.2), as ldconfig would name it; never the unversioned name, which
        # can be a linker script
        for f in sorted((f for f in os.listdir(d) if f.startswith(prefix)), key=len):
            path = os.path.join(d, f)
            try:
                with open(path, "rb") as lib:
                    if lib.read(4) == b"\x7fELF":
                        return path
            except OSError:
                continue
    return None


def _import_iptc():
    """Import python-iptables without running anything: its util module is loaded first and told not to
    `modprobe` (the tables it is asked to change exist, so their modules are loaded), library lookups go
    through find_library above, and XTABLES_LIBDIR spares an `ldconfig -N -v`."""
    if "iptc" in sys.modules and hasattr(sys.modules["iptc"], "Table"):
        return sys.modules["iptc"]
    import ctypes.util
    import importlib
    import importlib.util

    if "XTABLES_LIBDIR" not in os.environ:
        found = [os.path.join(d, "xtables") for d in _lib_dirs() if os.path.isdir(os.path.join(d, "xtables"))]
        if found:
            os.environ["XTABLES_LIBDIR"] = found[0]
    spec = importlib.util.find_spec("iptc")
    if spec is None or spec.loader is None:
        raise ImportError("python-iptables is not installed")
    package = importlib.util.module_from_spec(spec)
    sys.modules["iptc"] = package
    system_find = ctypes.util.find_library
    ctypes.util.find_library = find_library
    try:
        util = importlib.import_module("iptc.util")
        util.load_kernel = lambda name, exc_if_failed=False: None  # type: ignore[attr-defined]
        spec.loader.exec_module(package)
    except BaseException:
        sys.modules.pop("iptc", None)
        raise
    finally:
        ctypes.util.find_library = system_find
    return package


def available() -> bool:
    try:
        _import_iptc()
        return True
    except Exception:  # noqa: BLE001 - missing libiptc or python-iptables: fall back to restore
        return False


def _positions(name: str, fresh: Table, ops: list[Op]) -> dict[str, set[int]]:
    """Per chain, the positions of the rules to delete, each checked against the fresh save."""
    positions: dict[str, set[int]] = {}
    for op in ops:
        if op.kind != "rule":
            continue
        rules = fresh.chains.get(op.chain, [])
        if op.index >= len(rules) or rules[op.index].spec != op.spec:
            raise BackendError(f"{name} {op.chain} changed since it was read")
        positions.setdefault(op.chain, set()).add(op.index)
    return positions


class IptcBackend:
    flavour = "legacy"
    name = "python-iptables"

    def __init__(self) -> None:
        self._text = SaveRestoreBackend("legacy")

    def read(self, family: int) -> dict[str, Table]:
        return self._text.read(family)

    def apply(self, family: int, ops: list[Op]) -> None:
        if puts_back(ops):  # a rule from its saved text: what the restore tool reads (legacy: under the lock)
            self._text.apply(family, ops)
            return
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
        positions = _positions(name, fresh, ops)
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
