"""The native nftables backend: reads the reference plugins' own tables with `nft -j` and deletes rules by
handle in one `nft -f -` transaction. A host without an `nft` binary, or without these tables, has no native
rules: nothing is read there (no `nft` run at all without the binary; a listing of each table otherwise, and
`nft list tables` when one failed for another reason than its absence)."""

from __future__ import annotations

from cni_reaper import jsonio
from cni_reaper.reap.netfilter import flavour, processes
from cni_reaper.reap.netfilter.interface import BackendError
from cni_reaper.reap.netfilter.nftables.rules import TABLES, NativeOp, NativeRule, json_script, parse_listing, script

TIMEOUT_SECONDS = 30


class NftBackend:
    name = "nft (native tables)"

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary if binary is not None else flavour.which("nft")

    def _run(self, argv: list[str], stdin: str | None = None) -> str:
        assert self.binary
        try:
            proc = processes.run([self.binary, *argv], stdin, TIMEOUT_SECONDS)
        except OSError as exc:
            raise BackendError(f"nft: {exc}") from None
        if proc.code != 0:
            raise BackendError(f"nft {' '.join(argv[:3])} exited {proc.code}: {proc.err.strip()[:500]}")
        return proc.out

    def tables(self) -> set[tuple[str, str]]:
        """(family, name) of every nftables table (none without an nft binary)."""
        if not self.binary:
            return set()
        try:
            listed = jsonio.loads(self._run(["-j", "list", "tables"]) or "{}")
            return {(t["table"]["family"], t["table"]["name"]) for t in listed.get("nftables", [])
                    if isinstance(t, dict) and isinstance(t.get("table"), dict)}
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise BackendError(f"nft -j list tables: unreadable output ({exc})") from None

    def foreign_tables(self) -> tuple[tuple[str, str], ...]:
        """Every table that is not the plugins' native ones: a firewall manager's, kube-proxy's nftables mode, an
        operator's, and those named like iptables' (`ip nat`): iptables-nft-save does not list a base chain it
        did not make ("incompatible"), so a hand-made `table ip nat` is seen here or nowhere (iptables-nft's
        own rules are seen twice, which only ever refuses more)."""
        return tuple(sorted(self.tables() - set(TABLES)))

    def read(self, tables: tuple[tuple[str, str], ...] = TABLES) -> list[NativeRule]:
        """The rules of the plugins' native `tables` (all of them by default)."""
        if not self.binary:
            return []
        # each table listed at once, all at the same time: `nft list tables` fetches every rule of the host to
        # say which there are (as long as listing them, 50 ms with 1,000 attachments)
        return self.parsed(tables, self._run_all(self.listings(tables)))

    @staticmethod
    def listings(tables: tuple[tuple[str, str], ...]) -> list[list[str]]:
        """The arguments of nft that list `tables` (one command each; run them at once, with others)."""
        return [["-j", "list", "table", family, name] for family, name in tables]

    def parsed(self, tables: tuple[tuple[str, str], ...], listed: list[tuple[int, str, str]]) -> list[NativeRule]:
        """The rules of `tables` from their listings' (exit status, output, error output). `nft list tables`
        is asked only when a listing failed otherwise than as a missing table does (ENOENT; absent, nothing
        of it is removed)."""
        rules: list[NativeRule] = []
        present: set[tuple[str, str]] | None = None
        for (family, name), (code, out, err) in zip(tables, listed):
            if code != 0:
                if "No such file or directory" in err:
                    continue
                present = self.tables() if present is None else present
                if (family, name) in present:
                    raise BackendError(f"nft list table {family} {name} exited {code}: {err.strip()[:500]}")
                continue
            try:
                rules += parse_listing(out)
            except (ValueError, RecursionError) as exc:
                raise BackendError(f"nft -j list table {family} {name}: unreadable output ({exc})") from None
        return rules

    def _run_all(self, argvs: list[list[str]]) -> list[tuple[int, str, str]]:
        """(exit status, output, error output) of each nft command, all run at once."""
        assert self.binary
        try:
            done = processes.run_all([[self.binary, *argv] for argv in argvs], timeout=TIMEOUT_SECONDS)
        except OSError as exc:
            raise BackendError(f"nft: {exc}") from None
        return [(d.code, d.out, d.err) for d in done]

    def apply(self, ops: list[NativeOp]) -> None:
        """One transaction: deletions by handle as `nft -f` text; with a rule added back (undo), all as JSON."""
        if any(op.rule for op in ops):
            self._run(["-j", "-f", "-"], json_script(ops))
        elif ops:
            self._run(["-f", "-"], script(ops))

