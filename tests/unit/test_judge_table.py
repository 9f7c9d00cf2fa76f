"""The judgement's decision table, over its whole fact space (issue 42): every combination of the facts the
pure judge (plugin/cni_reaper/judge/) reads, and the promises that must hold in each. Pure: no root, no host.

- a sign of life on the host's own evidence (its path holds the namespace recorded, its veth is there, in
  this boot) and no word of the runtime or the scheduler: never dead, never cleaned;
- dead (anything a sweep cleans) only on positive evidence: a boot since, its namespace or veth gone, libcni
  dropping the cache entry the DEL saw (the whole chain's DEL succeeded), the runtime's or the scheduler's word;
- nothing known: unknown (nothing removed, its addresses protected);
- out of this process's reach, or blind, or another machine's: nothing cleaned;
- a mode: observe from any source wins, and observe removes nothing;
- a reservation: the dead life's own only when it names its container and ifname (or is the very file).
"""

from __future__ import annotations

import itertools

from cni_reaper.judge import (
    DEAD,
    DONE,
    EXPIRED,
    HELD,
    HOLDING,
    LEFT,
    LIVE,
    STATES,
    SWEEPABLE,
    UNKNOWN,
    WAIT,
    Verdict,
    modes,
    reservations,
)
from cni_reaper.judge.life import Sign, decide_cached, decide_record

SIGNS = (LIVE, DEAD, None)


class Life:
    def __init__(self, blind, other_machine, rebooted, path, veth) -> None:
        self.blind, self.other_machine, self.rebooted = blind, other_machine, rebooted
        self.path, self.veth = Sign(path, f"path {path}"), Sign(veth, f"veth {veth}")


class Deleted:
    def __init__(self, done, over) -> None:
        self.done, self.over = done, over


class Attachment:
    def __init__(self, life, word, held_due, left, deleted, far, unjudged=None) -> None:
        self.life, self.word, self.held_due, self.left, self.deleted, self.far = life, word, held_due, left, deleted, far
        self.mark_why, self.unjudged = "held", unjudged


LIVES = [Life(*c) for c in itertools.product((None, "blind"), (False, True), (False, True), SIGNS, SIGNS)]
WORDS = (None, Verdict(DEAD, "the runtime's word"), Verdict(LIVE, "the runtime lists it"))
DELETED = (None, *(Deleted(d, o) for d, o in itertools.product((False, True), (False, True))))
SPACE = list(itertools.product(LIVES, WORDS, (None, False, True), (None, "left"), DELETED, (None, "far")))
UNJUDGED = (None, "written by a later cni-reaper")


def _sign_of_life(life: Life) -> bool:
    return not life.blind and not life.other_machine and not life.rebooted and LIVE in (life.path.state, life.veth.state)


def _host_says_dead(life: Life) -> bool:
    return not life.blind and not life.other_machine and (life.rebooted or DEAD in (life.path.state, life.veth.state))


def test_the_space_is_whole():
    assert len(LIVES) == 2 * 2 * 2 * 3 * 3 and len(SPACE) == len(LIVES) * 3 * 3 * 2 * 5 * 2


def test_a_record_this_cni_reaper_may_not_judge_is_unknown_whatever_else_is_said():
    for life, word, held_due, left, deleted, far in SPACE:
        v = decide_record(Attachment(life, word, held_due, left, deleted, far, UNJUDGED[1]))
        assert v.state == UNKNOWN and v.why == UNJUDGED[1]


def test_every_combination_keeps_the_promises():
    seen = set()
    for life, word, held_due, left, deleted, far in SPACE:
        v = decide_record(Attachment(life, word, held_due, left, deleted, far))
        case = (life.__dict__, word, held_due, left, deleted and deleted.__dict__, far, v)
        seen.add(v.state)
        assert v.state in STATES, case
        if far is not None:
            assert v.state not in SWEEPABLE, case  # out of reach: never cleaned
        if word is not None:
            if far is None:
                assert v is word, case  # the runtime's or the scheduler's word is taken as said
            continue
        if held_due is False:
            assert v.state == HELD, case  # not looked at before its time; held protects
            continue
        _by_the_hosts_evidence(life, left, deleted, v, case)
    assert seen == {LIVE, DEAD, UNKNOWN, LEFT, HELD, DONE, EXPIRED, WAIT}


def _by_the_hosts_evidence(life, left, deleted, v, case) -> None:
    if v.state in SWEEPABLE:
        assert not (_sign_of_life(life) and v.state != DONE), case  # a sign of life is never dead
        # positive evidence: the host's own, or libcni dropping the entry the DEL saw
        assert _host_says_dead(life) or (deleted is not None and deleted.done), case
        assert v.state == (DEAD if deleted is None else DONE if deleted.done else EXPIRED), case
    if deleted is None and not _host_says_dead(life) and not _sign_of_life(life):
        assert v.state == UNKNOWN, case  # nothing known: unknown
    if deleted is None and _sign_of_life(life):
        assert v.state == LIVE, case
    if v.state == LEFT:
        assert left is not None and deleted is None, case
    if deleted is not None and not deleted.done:
        assert v.state in (WAIT, EXPIRED, UNKNOWN), case


def test_every_holding_state_is_not_cleaned():
    assert not set(HOLDING) & set(SWEEPABLE) and set(HOLDING) | set(SWEEPABLE) == set(STATES)


class Cached:
    def __init__(self, veth_there, path) -> None:
        self.veth_there, self.path = veth_there, Sign(path, f"path {path}")


def test_an_attachment_known_from_libcnis_cache_alone():
    one = [Cached(*c) for c in itertools.product((None, "veth1"), SIGNS)]
    assert decide_cached([]).state == UNKNOWN  # no entry: an ADD may be in flight
    for n in (1, 2, 3):
        for lives in itertools.product(one, repeat=n):
            v = decide_cached(list(lives))
            if any(c.veth_there or c.path.state == LIVE for c in lives):
                assert v.state == LIVE
            elif all(c.path.state == DEAD for c in lives):
                assert v.state == DEAD
            else:
                assert v.state == UNKNOWN


MODE_VALUES = (None, modes.CLEAN, modes.OBSERVE)


def test_a_mode_from_every_source():
    """Every combination of every source of a network's mode, and the facts whether it has records and whether
    an attachment found of it chains no cni-reaper."""
    network = "n"
    for known, every, wrapped, top, per, conflist, finder, forced, recorded, unchained in itertools.product(
            MODE_VALUES, (None, modes.OBSERVE), (None, "wrapped", *MODE_VALUES[1:]), MODE_VALUES, MODE_VALUES,
            MODE_VALUES, MODE_VALUES, MODE_VALUES, (False, True), (False, True)):
        known_map = {k: v for k, v in ((network, known), (modes.EVERY, every)) if v is not None}
        s = modes.ModeSources(known_map, {network: wrapped} if wrapped else {}, top,
                              {network: per} if per else {}, {network: conflist} if conflist else {}, finder, forced,
                              frozenset({network}) if recorded else frozenset(),
                              frozenset({network}) if unchained else frozenset())
        got = s.of(network)
        chained = (conflist is not None or (known is not None and wrapped is None)) and not unchained
        stated = known is not None or wrapped is not None or conflist is not None or per is not None
        said = [forced, every, known, conflist, per, wrapped] + ([] if chained else [top, finder])
        said += [modes.OBSERVE] if recorded and not stated else []
        assert got == (modes.OBSERVE if modes.OBSERVE in said else modes.CLEAN), (said, got)
        if modes.OBSERVE in (forced, every, known, conflist, per, wrapped):
            assert got == modes.OBSERVE  # observe from any of the network's own sources wins (its wrapper's too)
        if not chained and modes.OBSERVE in (top, finder):
            assert got == modes.OBSERVE  # a network that never chained cni-reaper: the file's top, the finder's
        if recorded and not stated:
            assert got == modes.OBSERVE  # it chained cni-reaper (it has records) in a mode no source says now


def test_a_dead_lifes_time_ahead_of_now_bounds_nothing():
    """libcni's cache entry written while the clock ran ahead (red team rt42): its time takes no reservation as
    the dead life's own, a re-ADD in flight may have made it since."""
    for made_at, now in itertools.product((0, 5, 10, 11), (5, 10)):
        b = reservations.bound(made_at, now)
        assert b == (made_at if made_at <= now else reservations.NONE_BY_TIME)
        for made in (0, 5, 10, 11):
            got = reservations.own(("c", "eth0"), None, b, ("c", "eth0"), (1, made, made))
            assert got == (made_at <= now and made <= made_at)


def test_a_reservation_is_judged_by_what_it_says():
    ident = (10, 1000, 1001)
    for said, found in itertools.product((("c", "eth0"), ("c", ""), ("c", "eth1"), ("d", "eth0")),
                                         ((10, 1000, 1001), (10, 1000, 2000), (11, 1000, 2000), (11, 3000, 3000),
                                          (10, 3000, 1001))):
        mine = said in (("c", "eth0"), ("c", ""))
        got = reservations.own(("c", "eth0"), ident, None, said, found)
        if found == ident:
            assert got  # the very file recorded
        elif not mine:
            assert not got  # another container's, or another ifname's
        else:  # a chmod, a hard link, a copy kept its time: own; made later (a newer life): not
            assert got == (found[1] == ident[1])
    assert reservations.own(("c", ""), None, 5, ("c", "x"), (1, 5, 9))
    assert not reservations.own(("c", ""), None, 5, ("c", "x"), (1, 6, 9))
    assert reservations.own(("c", ""), None, None, ("c", "x"), (1, 6, 9))
