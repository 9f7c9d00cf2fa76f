"""The STATUS's wait for the veth of a namespace just replaced at a recorded path (evidence._gone_with_the_replaced)
in the branches the real thing cannot be made to take here: a clock set back (the new namespace's change time
in the future) and a lock's hold shorter than the wait. The namespace at the path and the link are stand-ins;
the recreate itself runs for real in tests/integration/test_nomad_restart.py."""

from __future__ import annotations

import time

import pytest

from cni_reaper import files
from cni_reaper.reap import evidence, probes
from cni_reaper.state.record import NetnsId, Veth

VETH = Veth("veth0123abcd", 41)


@pytest.fixture
def replaced(monkeypatch):
    """A path that holds another namespace, made `age` seconds ago (negative: in the future), and a veth that
    goes after `goes` looks (None: never). Returns a setter."""
    state = {"age": 0.0, "goes": None, "looks": 0}

    def netns_id(path):
        return NetnsId(4, 4026532999, int((time.time() - state["age"]) * 1e9))

    def link_index(name):
        state["looks"] += 1
        goes = state["goes"]
        return None if goes is not None and state["looks"] > goes else VETH.ifindex

    monkeypatch.setattr(probes, "netns_id", netns_id)
    monkeypatch.setattr(probes, "link_index", link_index)
    return state


def facts() -> evidence.Facts:
    return evidence.Facts("/var/run/netns/alloc", NetnsId(4, 4026532111, 1), None, None, VETH)


def waited(view: evidence.View) -> tuple[tuple[str, str] | None, float]:
    start = time.monotonic()
    found = evidence._gone_with_the_replaced(facts(), view)
    return found, time.monotonic() - start


def test_a_veth_that_goes_within_the_wait_makes_the_life_dead(replaced):
    replaced["goes"] = 3
    found, _ = waited(evidence.View(recreate_wait=2.0))
    assert found is not None and found[0] == evidence.DEAD and VETH.name in found[1]


def test_a_clock_set_back_never_makes_the_wait_longer_than_the_wait(replaced):
    replaced["age"] = -60.0  # made "in a minute": the clock was set back since
    found, took = waited(evidence.View(recreate_wait=0.3))
    assert found is None and 0.25 <= took < 1.0, took


def test_a_namespace_older_than_the_wait_is_not_waited_for(replaced):
    replaced["age"] = 5.0
    found, took = waited(evidence.View(recreate_wait=2.0))
    assert found is None and took < 0.2 and replaced["looks"] == 1, (took, replaced)


def test_the_wait_ends_with_the_hold_of_the_lock_held(replaced):
    with files.holding(0.6, "a test lock"):  # a hold of 0.3 s
        found, took = waited(evidence.View(recreate_wait=5.0))
    assert found is None and took < 1.0, took
