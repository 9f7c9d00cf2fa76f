"""Records made in process through the plugin's own typed model (state/record.py), for unit tests."""

from __future__ import annotations

from cni_reaper.state.record import Life, Record, RecordSettings


def bare(network: str = "nomad", cid: str = "alloc-1", ifname: str = "eth0", netns: str = "") -> Record:
    """A record of an attachment with no evidence, address or port: what a unit test of a verb's or a sweep's
    bookkeeping needs of one."""
    life = Life(netns or f"/var/run/netns/{cid}", None, None, None, None, (), (), "2026-12-04T00:00:00.000000Z")
    return Record(network, cid, ifname, life, (), {}, RecordSettings("/i", "/c", "auto"))
