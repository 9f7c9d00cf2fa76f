"""The native nftables backend: reads the reference plugins' own tables with `nft -j` and deletes rules by
handle in one `nft -f -` transaction. A host without an `nft` binary, or without these tables, has no native
rules: nothing is read there (no `nft` run at all without the binary; a listing of each table otherwise, and
`nft list tables` when one failed for another reason than its absence)."""

from __future__ import annotations

import os
import subprocess

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

from cni_reaper import jsonio
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
            listed = jsonio.loads(self._run(["-j", "list", "tables"]) or "{}")
            return {(t["table"]["family"], t["table"]["name"]) for t in listed.get("nftables", [])
                    if isinstance(t, dict) and isinstance(t.get("table"), dict)}
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise BackendError(f"nft -j list tables: unreadable output ({exc})") from None

    def read(self) -> list[NativeRule]:
        if not self.binary:
            return []
        rules: list[NativeRule] = []
        present: set[tuple[str, str]] | None = None
        # each table listed at once, all at the same time: `nft list tables` fetches every rule of the host to
        # say which there are (as long as listing them, 50 ms with 1,000 attachments); asked only when a
        # listing failed otherwise than as a missing table does (ENOENT; absent, nothing of it is removed)
        listed = self._run_all([["-j", "list", "table", family, name] for family, name in TABLES])
        for (family, name), (code, out, err) in zip(TABLES, listed):
            if code != 0:
                if "No such file or directory" in err:
                    continue
                present = self.tables() if present is None else present
                if (family, name) in present:
                    raise BackendError(f"nft list table {family} {name} exited {code}: {err.strip()[:500]}")
                continue
            try:
                rules += parse_json(jsonio.loads(out))
            except (ValueError, RecursionError) as exc:
                raise BackendError(f"nft -j list table {family} {name}: unreadable output ({exc})") from None
        return rules

    def _run_all(self, argvs: list[list[str]]) -> list[tuple[int, str, str]]:
        """(exit status, output, error output) of each nft command, all run at once, their pipes read as they
        fill (one poll for all: a pipe left full would hold its writer)."""
        assert self.binary
        env = dict(os.environ, LC_ALL="C")
        procs: list[subprocess.Popen] = []
        try:
            for argv in argvs:
                procs.append(subprocess.Popen([self.binary, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, env=env))
            texts = _drain([pipe for p in procs for pipe in (p.stdout, p.stderr)], TIMEOUT_SECONDS)
            return [(p.wait(), texts[2 * k], texts[2 * k + 1]) for k, p in enumerate(procs)]
        except OSError as exc:
            raise BackendError(f"nft: {exc}") from None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()

    def add(self, rules: list[dict]) -> None:
        """Add rules given as nftables JSON (what `nft -j list` gives, without handles), in one transaction."""
        if rules:
            self._run(["-j", "-f", "-"], jsonio.dumps({"nftables": [{"add": {"rule": r}} for r in rules]}))

    def apply(self, ops: list[NativeOp]) -> None:
        if ops:
            self._run(["-f", "-"], script(ops))


def _drain(pipes: list[Any], timeout: float) -> list[str]:
    """Everything each pipe gives until its end, all read side by side (BackendError after `timeout`)."""
    import selectors
    import time

    chunks: dict[int, list[bytes]] = {pipe.fileno(): [] for pipe in pipes}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise BackendError(f"nft: no answer within {timeout:g} s")
            for key, _ in sel.select(left):
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
    return [b"".join(chunks[pipe.fileno()]).decode("utf-8", "replace") for pipe in pipes]
