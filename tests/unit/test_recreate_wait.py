"""The STATUS's wait for the veth of a namespace just replaced at a recorded path (evidence._note_lingering and
await_lingering) in the branches the real thing cannot be made to take here: a clock set back (the new
namespace's change time in the future), a namespace made long ago. The namespace at the path and the link are stand-ins;
the recreate itself runs for real in tests/integration/test_nomad_restart.py."""

from __future__ import annotations

import os
import time

import pytest

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


def facts(ns: NetnsId | None = None) -> evidence.Facts:
    """A life recorded in `ns` (by default one no thread can be in: no nsfs has device 999999)."""
    return evidence.Facts("/var/run/netns/alloc", ns or NetnsId(999999, 4026532111, 1), None, None, VETH)


def waited(view: evidence.View, ns: NetnsId | None = None) -> tuple[bool, float]:
    """What the judgement noted of the life, then the wait for it: (whether its veth went, how long it took)."""
    evidence._note_lingering(facts(ns), view)
    start = time.monotonic()
    went = evidence.await_lingering(view)
    return went, time.monotonic() - start


def test_a_veth_that_goes_within_the_wait_is_told(replaced):
    replaced["goes"] = 3
    went, _ = waited(evidence.View(recreate_wait=2.0))
    assert went


def test_a_clock_set_back_never_makes_the_wait_longer_than_the_wait(replaced):
    replaced["age"] = -60.0  # made "in a minute": the clock was set back since
    went, took = waited(evidence.View(recreate_wait=0.3))
    assert not went and 0.25 <= took < 1.0, took


def test_a_namespace_older_than_the_wait_is_not_waited_for(replaced):
    replaced["age"] = 5.0
    view = evidence.View(recreate_wait=2.0)
    went, took = waited(view)
    assert not went and view.lingering == [] and took < 0.2, took



def test_a_namespace_a_thread_is_in_is_not_waited_for(replaced):
    """The life recorded in this very process's namespace (a thread is in it: it lives on, and its veth)."""
    st = os.stat("/proc/self/ns/net")
    went, took = waited(evidence.View(recreate_wait=2.0), NetnsId(st.st_dev, st.st_ino, 1))
    assert not went and replaced["looks"] == 0 and took < 1.5, (took, replaced)
