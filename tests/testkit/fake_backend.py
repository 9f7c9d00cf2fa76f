"""A netfilter backend for unit tests of the clean-up loop (kube-proxy's iptables `testing/fake.go` is the
model): the tables are iptables-save text held per family; it records every read and every transaction
and fails on command. Applying removes exactly the lines a real restore would, and refuses (changing
nothing) a deletion of a rule or chain that is not there, as iptables-restore does.

It reads its text with a parser of its own (shlex, dictionaries), not the package's: a bug in the package's
parser then shows as a plan that does not fit these tables. mypy holds it to the Backend interface (below)."""

from __future__ import annotations

import shlex

TYPE_CHECKING = False

from cni_reaper.reap.netfilter.interface import Backend, BackendError, LockHeld
from cni_reaper.reap.netfilter.iptables.rules import Op, Rule, Table, by_table

FIELDS = {"-s": "source", "--source": "source", "--comment": "comment", "-j": "target", "-g": "target",
          "--to-destination": "to_destination"}


def read_tables(text: str) -> dict[str, Table]:
    """iptables-save text as the package's types, read independently of the package's parser."""
    tables: dict[str, Table] = {}
    table: Table | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            table = tables.setdefault(line[1:], Table(line[1:]))
        elif table is not None and line.startswith(":"):
            name, policy = line[1:].split(" ", 2)[:2]
            table.chains.setdefault(name, [])
            if policy != "-":
                table.builtin.add(name)
        elif table is not None and line.startswith("-A "):
            chain, spec = line[3:].split(" ", 1)
            words = shlex.split(spec)
            found: dict[str, str | None] = dict.fromkeys(("source", "comment", "target", "to_destination"))
            for i, w in enumerate(words[:-1]):
                if w in FIELDS and (i == 0 or words[i - 1] != "!"):
                    found[FIELDS[w]] = words[i + 1]
            rules = table.chains.setdefault(chain, [])
            rules.append(Rule(chain, spec, tuple(words), found["source"], found["comment"], found["target"],
                              found["to_destination"], len(rules)))
    return tables


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
        return read_tables(self.text[family])

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


if TYPE_CHECKING:  # held to the interface it stands in for, as kube-proxy's `var _ = Interface(&Fake{})`
    _: Backend = FakeBackend("")
