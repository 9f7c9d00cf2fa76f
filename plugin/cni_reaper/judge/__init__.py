"""The judgement, pure: facts in, verdict out (judge/life.py: an attachment's; judge/modes.py: a network's mode;
judge/reservations.py: whose a reservation is). It imports nothing that touches the kernel or files.

Here, what the judgement says of an attachment: its state and why, as a value (Verdict), and what each state
means to a sweep (the package itself: every pass loads it, and one module less is loaded on every call)."""

from __future__ import annotations

LIVE, DEAD, UNKNOWN = "live", "dead", "unknown"
LEFT = "left"  # dead, but what it left no sweep may take (claims.py): it waits for the runtime's DEL or GC
HELD = "held"  # dead, and something not ours holds what it left (a foreign jump to its chain): looked at again later
DONE, EXPIRED, WAIT = "tombstone-done", "tombstone-expired", "tombstone-wait"
SWEEPABLE = (DEAD, DONE, EXPIRED)  # what a sweep cleans and then drops
HOLDING = (LIVE, UNKNOWN, WAIT, LEFT, HELD)  # what keeps its addresses and its container protected
STATES = (LIVE, DEAD, UNKNOWN, LEFT, HELD, DONE, EXPIRED, WAIT)


class Verdict:
    """A state and why. `parts`: of a dead attachment by the runtime's or the scheduler's word, the parts of
    its leftovers that may go (None: every one, reap/targets.PARTS)."""

    __slots__ = ("parts", "state", "why")

    def __init__(self, state: str, why: str, parts: frozenset[str] | None = None) -> None:
        self.state, self.why, self.parts = state, why, parts

    def __repr__(self) -> str:
        return f"Verdict({self.state!r}, {self.why!r})"
