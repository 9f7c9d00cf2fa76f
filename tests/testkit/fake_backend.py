"""A netfilter backend for unit tests of the clean-up loop (kube-proxy's iptables `testing/fake.go` is the
model): the tables are iptables-save text held per family; it records every read and every transaction
and fails on command. Applying removes exactly the lines a real restore would, and refuses (changing
nothing) a deletion of a rule or chain that is not there, as iptables-restore does."""

from __future__ import annotations

from cni_reaper.reap.netfilter.interface import BackendError, LockHeld
from cni_reaper.reap.netfilter.iptables.rules import Op, Table, by_table, parse_save


def apply_ops(text: str, ops: list[Op]) -> str:
    """`text` (iptables-save output) after `ops`, all or nothing per table; BackendError if one cannot apply."""
    lines = text.splitlines()
    for table, table_ops in by_table(ops).items():
        start = lines.index(f"*{table}")
        end = lines.index("COMMIT", start)
        block = lines[start:end]
        for op in sorted(table_ops, key=lambda o: o.kind == "chain"):
            if op.kind == "rule":
                line = f"-A {op.chain} {op.spec}"
                if line not in block:
                    raise BackendError(f"{table} {op.chain}: no such rule: {op.spec}")
                block.remove(line)
            else:
                header = [l for l in block if l.startswith(f":{op.chain} ")]
                if not header or any(l.startswith("-A ") and l.split()[-1] == op.chain for l in block):
                    raise BackendError(f"{table}: cannot delete chain {op.chain}")
                block = [l for l in block if l not in header and not l.startswith(f"-A {op.chain} ")]
        lines[start:end] = block
    return "\n".join(lines) + "\n"


class FakeBackend:
    flavour = "fake"
    name = "fake"

    def __init__(self, text4: str, text6: str = "*nat\nCOMMIT\n*filter\nCOMMIT\n") -> None:
        self.text = {4: text4, 6: text6}
        self.reads: list[int] = []
        self.transactions: list[tuple[int, list[Op]]] = []  # every apply, failed or not
        self.applied: list[tuple[int, list[Op]]] = []  # the ones that changed the tables
        self.fail_next = 0  # the next N transactions fail (a concurrent writer changed the table)
        self.fail_batches = False  # every transaction of more than one operation fails
        self.lock_held = False  # every transaction: the xtables lock is held elsewhere
        self.stubborn: set[str] = set()  # rule specs (or chain names) whose deletion always fails
        self.between: list = []  # callables run once each after a read, before the next apply (a writer)

    def read(self, family: int) -> dict[str, Table]:
        self.reads.append(family)
        return parse_save(self.text[family])

    def apply(self, family: int, ops: list[Op]) -> None:
        self.transactions.append((family, list(ops)))
        while self.between:
            self.between.pop(0)(self)
        if self.lock_held:
            raise LockHeld("the xtables lock is held by another process")
        if self.fail_next:
            self.fail_next -= 1
            raise BackendError("a concurrent writer changed the table")
        if self.fail_batches and len(ops) > 1:
            raise BackendError("the transaction failed")
        if any(op.spec in self.stubborn or (op.kind == "chain" and op.chain in self.stubborn) for op in ops):
            raise BackendError("this rule cannot be deleted")
        self.text[family] = apply_ops(self.text[family], ops)
        self.applied.append((family, list(ops)))
