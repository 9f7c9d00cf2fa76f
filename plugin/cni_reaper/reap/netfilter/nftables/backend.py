"""The native nftables backend: reads the reference plugins' own tables with `nft -j` and deletes rules by
handle in one `nft -f -` transaction. A host without an `nft` binary, or without these tables, has no native
rules: nothing is read there (no `nft` run at all without the binary; a listing of each table otherwise, and
`nft list tables` when one failed for another reason than its absence)."""

from __future__ import annotations

import json
import os
import subprocess

from cni_reaper.reap.netfilter import flavour
from cni_reaper.reap.netfilter.interface import BackendError
from cni_reaper.reap.netfilter.nftables.rules import TABLES, NativeOp, NativeRule, parse_json, script

TIMEOUT_SECONDS = 30


class NftBackend:
    name = "nft (native tables)"

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary if binary is not None else flavour.which("nft")

    def _run(self, argv: list[str], stdin: str | None = None) -> str:
        assert self.binary
        try:
            proc = subprocess.run([self.binary, *argv], input=stdin, capture_output=True, text=True, check=False,
                                  env=dict(os.environ, LC_ALL="C"), timeout=TIMEOUT_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"nft: {exc}") from None
        if proc.returncode != 0:
            raise BackendError(f"nft {' '.join(argv[:3])} exited {proc.returncode}: {proc.stderr.strip()[:500]}")
        return proc.stdout

    def tables(self) -> set[tuple[str, str]]:
        """(family, name) of every nftables table (none without an nft binary)."""
        if not self.binary:
            return set()
        try:
            listed = json.loads(self._run(["-j", "list", "tables"]) or "{}")
            return {(t["table"]["family"], t["table"]["name"]) for t in listed.get("nftables", [])
                    if isinstance(t, dict) and isinstance(t.get("table"), dict)}
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"nft -j list tables: unreadable output ({exc})") from None

    def read(self) -> list[NativeRule]:
        if not self.binary:
            return []
        rules: list[NativeRule] = []
        present: set[tuple[str, str]] | None = None
        for family, name in TABLES:
            # each table listed at once: `nft list tables` fetches every rule of the host to say which there
            # are (as long as listing them, 50 ms with 1,000 attachments); asked only when a listing failed
            # otherwise than as a missing table does (ENOENT; absent, nothing of it is removed)
            try:
                text = self._run(["-j", "list", "table", family, name])
            except BackendError as exc:
                if "No such file or directory" in str(exc):
                    continue
                present = self.tables() if present is None else present
                if (family, name) in present:
                    raise
                continue
            try:
                rules += parse_json(json.loads(text))
            except ValueError as exc:
                raise BackendError(f"nft -j list table {family} {name}: unreadable output ({exc})") from None
        return rules

    def add(self, rules: list[dict]) -> None:
        """Add rules given as nftables JSON (what `nft -j list` gives, without handles), in one transaction."""
        if rules:
            self._run(["-j", "-f", "-"], json.dumps({"nftables": [{"add": {"rule": r}} for r in rules]}))

    def apply(self, ops: list[NativeOp]) -> None:
        if ops:
            self._run(["-f", "-"], script(ops))
