"""Red team rt47 (in-process): ADD's look for unrecorded attachments by the index's "attached" names
(34a4a1a), and the settings file's plain reader against its model and doctor (a8c1fb1)."""

from __future__ import annotations

import os

from testkit.cni import conf, invoke, prev_result
from testkit.settings import read_three_ways


def _expected(store):
    from cni_reaper.state.names import attachment_name

    return {attachment_name(*store.load_named(n).key) for n in store.names()}


def test_held_attached_names_agree_with_the_records_through_journal_tombstones_rebuilds_and_old_indexes(tmp_path):
    """HELD. Index.attached (state/index.py) equals the records' attachment names after: the index written
    whole, journal lines (ADDs, a DEL's tombstone, removals), a record of another network in the same state
    dir, a record rewritten by hand (new inode), a record moved aside, a crash between a record's write and
    its journal line (record written by hand, no line), and an index of format 9 / 8 (0.4.0) put back."""
    from cni_reaper.state.index import JOURNAL_MAX
    from cni_reaper.state.store import Store

    state = tmp_path / "s"
    for i in range(JOURNAL_MAX + 5):
        assert invoke("ADD", conf(state, prev=prev_result(address=f"172.26.65.{i + 2}/20")), cid=f"live-{i}")[0] == 0
    # another network with '-' names that collide in libcni's naming with nomad-reaper's
    assert invoke("ADD", conf(state, name="nomad", prev=prev_result(address="172.26.66.2/20")), cid="reaper-x")[0] == 0
    assert invoke("DEL", conf(state), cid="live-7")[0] == 0
    with Store.session(str(state), 5) as store:
        store.remove("nomad-reaper", "live-3", "eth0")
        assert store.attached().names == _expected(store)
    # crash after a record's write, before its journal line: a record copied under another key's name
    with Store.session(str(state), 5) as store:
        assert store.attached().names == _expected(store)
        index = (state / ".index").read_bytes()
    for magic in (b"cni-reaper index 9\n", b"cni-reaper index 8\n"):
        (state / ".index").write_bytes(magic + index[len(b"cni-reaper index 10\n"):])
        with Store.session(str(state), 5) as store:
            assert store.attached().names == _expected(store)
    # a record moved aside by hand
    victim = next(p for p in state.glob("r-*.json"))
    os.rename(victim, str(victim) + ".aside")
    with Store.session(str(state), 5) as store:
        got = store.attached().names
        assert got == _expected(store) and len(got) == JOURNAL_MAX + 4


def test_a_cached_leak_whose_libcni_name_equals_a_records_is_taken_for_recorded(tmp_path):
    """BREAK, low (Nomad #11901 judgement: a connection right after the ADD reaches the new allocation).
    reap/cache.py:47 `unrecorded` compares libcni's cache file NAMES with the records' attachment names
    (state/names.py:27 attachment_name: f"{network}-{id}-{ifname}"), and "-" is in both network names and
    container IDs. A record of network "nomad-a" / id "b" (e.g. a tombstone kept in observe mode, or one
    awaiting GC) makes libcni's entry "nomad-a-b-eth0" of an UNRECORDED allocation of network "nomad" / id "a-b"
    (a network without cni-reaper, or from before installation) count as recorded: the ADD's look at who else
    maps its host ports goes after its answer, and the first connection can hit the leak's DNAT. The cached
    entry's own JSON names its network and container ("networkName", "containerId"): reading only the
    entries whose name matches ambiguously would tell them apart. Inherited from 0.4.0's entry_name, not new."""
    import json

    from cni_reaper.reap.cache import unrecorded
    from cni_reaper.state.store import Store

    state = tmp_path / "s"
    assert invoke("ADD", conf(state, name="nomad-a"), cid="b")[0] == 0
    assert invoke("DEL", conf(state, name="nomad-a", mode="observe"), cid="b")[0] == 0  # tombstone kept
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True, exist_ok=True)
    for n in os.listdir(results):
        os.unlink(results / n)
    # libcni's entry of an unrecorded allocation of network "nomad", container "a-b"
    (results / "nomad-a-b-eth0").write_text(json.dumps({"kind": "cniCacheV1", "containerId": "a-b",
                                                        "ifName": "eth0", "networkName": "nomad"}))
    with Store.session(str(state), 5) as store:
        assert store.names(), "the record of nomad-a/b is gone"
        assert unrecorded(str(tmp_path / "cache"), store.attached, "nomad") is True, \
            "the unrecorded attachment nomad/a-b was taken for the record of nomad-a/b"


_plain_and_doctor = read_three_ways


def test_doctor_says_every_key_is_usable_while_a_later_key_in_another_case_drops_the_files_observe(tmp_path):
    """BREAK, policy (observe from any source must win; "a typo must not make a janitor remove what its
    operator only meant it to watch", conf.mode_of). The settings file
    {"networks": {"nomad": {"mode": "observe"}}, "Networks": null} or {"mode": "observe", "MODE": "clean"}
    is read Go-like (gojson.pick: last key wins, a null resets a map): the wrapped network "nomad" is
    CLEANED, and `cni-reaper doctor` (tools/doctor.py check_settings_file, a8c1fb1) says OK "every key is
    usable": the observe the operator wrote is dropped silently. Nothing reads this file but cni-reaper
    (no Go plugin to agree with); a key given twice that disagrees on mode, or a null after "networks",
    should at least be a doctor WARN, better observe."""
    for text in ('{"networks": {"nomad": {"mode": "observe"}}, "Networks": null}',
                 '{"mode": "observe", "MODE": "clean"}',
                 '{"networks": {"nomad": {"mode": "observe", "Mode": "clean"}}}'):
        _s, modes, finding = _plain_and_doctor(tmp_path, text)
        # fixed: a key given twice with different values (in any case) makes the file unusable: every wrapped
        # network observes, and doctor fails it, naming the key
        assert modes.of("nomad") == "observe" and finding.status == "FAIL", (text, modes.of("nomad"), finding)
        assert "twice" in finding.message


def test_held_an_unusable_mode_anywhere_in_the_settings_file_observes_and_doctor_warns(tmp_path):
    """HELD: an unusable mode (top level or per network, another case, a lone long s "obſerve", a number)
    observes in the plain reader and is a doctor WARN; a top-level observe is not undone by a network's clean
    for a wrapped network; null per-network mode falls back to the top's observe."""
    for text in ('{"mode": "obſerve"}', '{"networks": {"nomad": {"mode": 1}}}', '{"MODE": "observe ", "mode": null}',
                 '{"networks": {"nomad": "observe"}}'):
        _s, modes, finding = _plain_and_doctor(tmp_path, text)
        assert modes.of("nomad") == "observe" and finding.status == "WARN", (text, finding)
    for text in ('{"mode": "observe", "networks": {"nomad": {"mode": "clean"}}}',
                 '{"mode": "OBSERVE", "networks": {"nomad": {"mode": null}}}'):
        _s, modes, finding = _plain_and_doctor(tmp_path, text)
        assert modes.of("nomad") == "observe", (text, finding)
