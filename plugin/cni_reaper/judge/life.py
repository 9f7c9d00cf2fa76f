"""The judgement of life and death, pure: facts in, a Verdict out (docs/how-it-works.md, "Evidence").

It reads what an observer (reap/evidence.py, the only place that looks at the host) says of a life and of its
record, through the attributes below; it imports nothing that touches the kernel or files. Each rule is a row
of the decision table in the docs, in the order the rows are written there, and tests/unit/test_judge_table.py
enumerates every combination of the facts it reads.

A life's facts (LifeFacts): `blind` (why this host cannot judge any life: /proc not there; None: it can),
`other_machine` (recorded on another machine), `rebooted` (recorded in an earlier boot of this host), `path`
and `veth` (Sign: what its netns path and the host side of its veth pair say: LIVE, DEAD or None, not known).
The observer may compute `path` and `veth` only when asked: the judge asks `veth` only when `path` says no
life.

A record's facts (RecordFacts): `unjudged` (why this cni-reaper may not judge it at all: a later one wrote it;
None: it may), `life` (its current life's), `word` (the runtime's or the scheduler's Verdict of
it, or None), `held_due` (a held mark: None none, False its retry time has not come, True it has), `left` (the
left-for-the-runtime mark's why, or None), `mark_why` (a mark's why), `deleted` (None: no DEL; else whether
libcni dropped its cache entry since, `done`, and whether the DEL is long over, `over`), `far` (why its rules are
out of this process's reach, or None).
"""

from __future__ import annotations

from cni_reaper.judge import DEAD, DONE, EXPIRED, HELD, LEFT, LIVE, SWEEPABLE, UNKNOWN, WAIT, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class LifeFacts(Protocol):
        @property
        def blind(self) -> str | None: ...
        @property
        def other_machine(self) -> bool: ...
        @property
        def rebooted(self) -> bool: ...
        @property
        def path(self) -> Sign: ...
        @property
        def veth(self) -> Sign: ...

    class Deleted(Protocol):
        @property
        def done(self) -> bool: ...
        @property
        def over(self) -> bool: ...

    class RecordFacts(Protocol):
        @property
        def unjudged(self) -> str | None: ...
        @property
        def life(self) -> LifeFacts: ...
        @property
        def word(self) -> Verdict | None: ...
        @property
        def held_due(self) -> bool | None: ...
        @property
        def left(self) -> str | None: ...
        @property
        def mark_why(self) -> str: ...
        @property
        def deleted(self) -> Deleted | None: ...
        @property
        def far(self) -> str | None: ...

    class CachedFacts(Protocol):
        @property
        def veth_there(self) -> str | None: ...
        @property
        def path(self) -> Sign: ...


class Sign:
    """What one look says: LIVE, DEAD or None (nothing known), and why."""

    __slots__ = ("state", "why")

    def __init__(self, state: str | None, why: str) -> None:
        self.state, self.why = state, why


def decide_life(f: LifeFacts) -> Verdict:
    """LIVE, DEAD or UNKNOWN, and why. Alive wins over dead; absence of a look is no evidence."""
    if f.blind is not None:
        return Verdict(UNKNOWN, f.blind)
    if f.other_machine:
        return Verdict(UNKNOWN, "recorded on another machine (machine-id differs): not this host's to clean")
    if f.rebooted:
        return Verdict(DEAD, "the host has booted since it was recorded")
    path = f.path
    if path.state == LIVE:
        return Verdict(LIVE, path.why)
    veth = f.veth
    if veth.state == LIVE:
        return Verdict(LIVE, veth.why)
    if path.state == DEAD:
        return Verdict(DEAD, path.why)
    if veth.state == DEAD:
        return Verdict(DEAD, veth.why)
    return Verdict(UNKNOWN, f"{path.why}; {veth.why}")


def decide_tombstone(f: RecordFacts) -> Verdict:
    """DONE, EXPIRED or WAIT, and why: done when libcni dropped the cache entry it had when DEL ran (the whole
    chain's DEL succeeded); expired when the DEL is long over and the life is dead; waiting otherwise."""
    assert f.deleted is not None
    if f.deleted.done:
        return Verdict(DONE, "libcni dropped its cache entry: the whole chain's DEL succeeded")
    if f.deleted.over:
        life = decide_life(f.life)
        if life.state == DEAD:
            return Verdict(EXPIRED, f"its DEL did not finish and {life.why}")
    return Verdict(WAIT, "its DEL may be in flight")


def decide_record(f: RecordFacts) -> Verdict:
    """The one judgement of a recorded attachment: unknown when this cni-reaper may not judge it (a later one
    wrote it: kept as it is, its addresses protected); the runtime's or the scheduler's word when there is one;
    else held (no look at its evidence) while a held mark's retry time has not come; else its tombstone's or its
    life's verdict, which a left mark makes LEFT when dead and not torn down. Out of this process's reach, a
    dead one is UNKNOWN."""
    if f.unjudged is not None:
        return Verdict(UNKNOWN, f.unjudged)
    if f.word is not None:
        v = f.word
    elif f.held_due is False:
        return Verdict(HELD, f.mark_why)
    else:
        v = decide_tombstone(f) if f.deleted is not None else decide_life(f.life)
        if f.left is not None and v.state == DEAD and f.deleted is None:
            v = Verdict(LEFT, f.left)
    if f.far is not None and v.state in SWEEPABLE:
        return Verdict(UNKNOWN, f.far)
    return v


def decide_cached(lives: list[CachedFacts]) -> Verdict:
    """An attachment with no record, by libcni's cache entries of it: DEAD when every cached life's netns is gone
    in a verified directory and none of its veths is left; LIVE when a veth or a namespace of one is there;
    UNKNOWN otherwise (no entry: an ADD in flight, or another runtime's)."""
    if not lives:
        return Verdict(UNKNOWN, "no libcni cache entry of it (an ADD may be in flight, or it is another runtime's)")
    signs = [_cached_life(c) for c in lives]
    for state in (LIVE, UNKNOWN):
        found = next((s for s in signs if s.state == state), None)
        if found is not None:
            return found
    return signs[0]


def _cached_life(c: CachedFacts) -> Verdict:
    if c.veth_there is not None:
        return Verdict(LIVE, f"its veth is there ({c.veth_there})")
    path = c.path
    return Verdict(path.state, path.why) if path.state is not None else Verdict(UNKNOWN, path.why)
