"""Backend over iptables-{nft,legacy}-save and -restore: read the tables as text, delete with one
`restore --noflush` run per family, holding one transaction (`*table` ... `COMMIT`) per table, the deletions
written from the saved rule text by `restore_text`.

For legacy, restore takes the xtables lock itself (`-w`), so a concurrent writer's rules are not lost.
"""

from __future__ import annotations

import os
import subprocess

from cni_reaper.reap.netfilter import flavour as flavours
from cni_reaper.reap.netfilter.interface import BackendError, LockHeld
from cni_reaper.reap.netfilter.iptables.rules import Op, Table, by_table, parse_save

TABLES = ("nat", "filter")
LOCK_WAIT_SECONDS = "3"
TIMEOUT_SECONDS = 30


class SaveRestoreBackend:
    def __init__(self, flavour: str) -> None:
        self.flavour = flavour
        self.name = f"iptables-{flavour}-restore"
        self._last: dict[int, tuple[str, dict[str, Table]]] = {}  # family -> the last save (no comments), parsed

    def _tool(self, family: int, kind: str) -> str:
        name = f"{'ip6' if family == 6 else 'ip'}tables-{self.flavour}-{kind}"
        path = flavours.which(name)
        if path is None:
            raise BackendError(f"{name} not found on PATH")
        return path

    def _run(self, argv: list[str], stdin: str | None = None) -> str:
        env = dict(os.environ, LC_ALL="C")
        try:
            proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=TIMEOUT_SECONDS,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"{os.path.basename(argv[0])}: {exc}") from None
        if proc.returncode != 0:
            message = f"{os.path.basename(argv[0])} exited {proc.returncode}: {proc.stderr.strip()[:500]}"
            if proc.returncode == 4 and "xtables lock" in proc.stderr:
                raise LockHeld(message)
            raise BackendError(message)
        return proc.stdout

    def read(self, family: int) -> dict[str, Table]:
        # one process for all tables: cheaper than one per table. A save equal to the last one (but for its
        # comments: the time) is not parsed again (python-iptables reads again under the lock before it commits)
        text = "\n".join(line for line in self._run([self._tool(family, "save")]).splitlines() if not line.startswith("#"))
        last = self._last.get(family)
        if last is not None and last[0] == text:
            return last[1]
        tables = parse_save(text)
        tables = {name: tables[name] for name in TABLES if name in tables}
        self._last[family] = (text, tables)
        return tables

    def apply(self, family: int, ops: list[Op]) -> None:
        if ops:
            self.restore(family, restore_text(ops))

    def restore(self, family: int, text: str) -> None:
        """One `restore --noflush` run of `text` (a transaction per table; legacy under the xtables lock)."""
        argv = [self._tool(family, "restore"), "--noflush"]
        if self.flavour == "legacy":
            argv += ["-w", LOCK_WAIT_SECONDS]
        self._run(argv, text)


def restore_text(ops: list[Op]) -> str:
    """The `iptables-restore --noflush` input that applies `ops`: one transaction per table; in each, rules
    before chains (a chain goes once nothing jumps to it), and rules in chain order, so that iptables-nft
    finds each one at the head of what is left (in random order a large sweep is quadratic: 1.5 s instead
    of 0.4 s for 1,000 attachments here)."""
    lines: list[str] = []
    for table, table_ops in by_table(ops).items():
        lines.append(f"*{table}")
        for op in sorted(table_ops, key=lambda o: (o.kind == "chain", o.chain, o.index)):
            if op.kind == "rule":
                lines.append(f"-D {op.chain} {op.spec}")
            else:
                lines += [f"-F {op.chain}", f"-X {op.chain}"]
        lines.append("COMMIT")
    return "\n".join(lines) + "\n"
