"""What a clean-up did: per attachment the items removed (or, in a dry run or in observe mode, that would have
been), what failed and what could not be verified gone (their records are kept and retried), what was left
on purpose and why, what something not ours holds (their records are kept and looked at again later), the
backends used, and counts by kind for the metrics."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.values import Key


class Outcome:
    __slots__ = ("backends", "counts", "errors", "failed", "held", "removed", "skipped", "spared", "unknown",
                 "unverified", "waiting", "would", "would_counts")

    def __init__(self) -> None:
        self.removed: dict[Key, list[str]] = {}
        self.failed: set[Key] = set()  # something could not be removed: the record is kept
        self.unverified: set[Key] = set()  # a leftover could not be looked at: the record is kept
        self.skipped: list[str] = []  # what was left on purpose, and why (the text the log and the CLI say)
        self.spared: dict[tuple[str, str], list[str]] = {}  # (network, container ID) -> why something of it was spared
        self.errors: list[str] = []
        self.backends: dict[int, str] = {}  # family -> backend name
        self.counts: dict[tuple[str, str], int] = {}  # (network, kind) -> items removed
        self.unknown: dict[str, int] = {}  # why something could not be judged -> how many
        self.would: dict[Key, list[str]] = {}  # observe mode: what would have been removed
        self.would_counts: dict[tuple[str, str], int] = {}
        self.waiting: dict[Key, str] = {}  # left for the runtime's DEL or GC, and why (claims)
        self.held: dict[Key, str] = {}  # held by something not ours, and why: the record stays, looked at later

    @property
    def backend(self) -> str:
        """The backend used, or one per family when they differ: "ipv4: python-iptables, ipv6: ..."."""
        names = set(self.backends.values())
        if len(names) <= 1:
            return names.pop() if names else ""
        return ", ".join(f"ipv{f}: {n}" for f, n in sorted(self.backends.items()))

    @property
    def kept(self) -> set[Key]:
        return self.failed | self.unverified

    def spare(self, network: str, container_id: str, what: str, why: str) -> None:
        """Something of the attachments of (network, container ID) spared, left on purpose: `what` (an address,
        or "" for the container's chains) and why."""
        self.spared.setdefault((network, container_id), []).append(why)
        self.skipped.append(f"{network} {container_id}{' ' + what if what else ''}: {why}")

    def spared_of(self, key: Key) -> bool:
        """Whether this clean-up spared something of attachment `key`'s container on its network."""
        return key.owner in self.spared

    def note(self, key: Key, what: str, kind: str, n: int = 1) -> None:
        """One removal (or `n` of a kind counted as one line: conntrack entries) of attachment `key`."""
        self.removed.setdefault(key, []).append(what)
        self.counts[(key.network, kind)] = self.counts.get((key.network, kind), 0) + n

    def merge(self, other: Outcome) -> None:
        for k, items in other.removed.items():
            self.removed.setdefault(k, []).extend(items)
        for k2, n in other.counts.items():
            self.counts[k2] = self.counts.get(k2, 0) + n
        self.failed |= other.failed
        self.unverified |= other.unverified
        self.skipped += other.skipped
        for owner, whys in other.spared.items():
            self.spared.setdefault(owner, []).extend(whys)
        self.errors += other.errors
        self.backends.update(other.backends)
        for why, n in other.unknown.items():
            self.unknown[why] = self.unknown.get(why, 0) + n
        for k, items in other.would.items():
            self.would.setdefault(k, []).extend(items)
        for k2, n in other.would_counts.items():
            self.would_counts[k2] = self.would_counts.get(k2, 0) + n
        self.waiting.update(other.waiting)
        self.held.update(other.held)
