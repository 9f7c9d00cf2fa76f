"""The one resolution of each network's mode (state/modes.py): observe wins, and whatever cannot be read says
observe, never clean (the second red team of issue 32). Plus the one look at a link that can fail unseen."""

from __future__ import annotations

import json
import os

import pytest

from cni_reaper.cni.settings_file import SettingsFile
from cni_reaper.state import modes


def file_with(networks=None, keys=None, problem=""):
    s = SettingsFile("/etc/cni-reaper/config.json")
    s.networks, s.keys, s.problem = networks or {}, keys or {}, problem
    return s


def test_observe_wins_over_every_clean():
    f = file_with({"w": {"mode": "observe"}})
    s = modes.sources({"w": "clean", "c": "clean"}, {"w": "clean"}, f)
    assert (s.of("w"), s.of("c")) == ("observe", "clean")
    assert modes.sources({"c": "observe"}, {}, file_with({"c": {"mode": "clean"}})).of("c") == "observe"


def test_the_files_top_level_mode_governs_every_network_that_does_not_chain_cni_reaper():
    s = modes.sources({"chained": "clean", "w1": "clean"}, {"w1": "clean", "w2": "wrapped"}, file_with(keys={"mode": "observe"}))
    assert s.of("w1") == s.of("w2") == "observe"  # the wrapped networks, not only those with records here
    assert s.of("never") == "observe"  # a leak of a network no call noted yet (issue 42, case 1)
    assert s.of("chained") == "clean"  # its conflist says clean


def test_the_mode_of_the_call_that_found_a_target_governs_networks_that_never_chained_cni_reaper():
    s = modes.sources({"nomad": "observe", "chained": "clean"}, {}, None, finder="observe")
    assert s.of("other") == "observe"  # issue 42, case 2: observe only, nothing removed anywhere
    assert s.of("chained") == "clean"


def test_a_settings_file_that_cannot_be_used_observes_its_networks():
    s = modes.sources({"w": "clean", "c": "clean"}, {"w": "clean"}, file_with({"n": {}}, problem="not JSON"))
    assert (s.of("w"), s.of("n"), s.of("c")) == ("observe", "observe", "clean")


class Call:
    def __init__(self, name, mode, wrapped_by=None) -> None:
        self.name, self.mode, self.wrapped_by = name, mode, wrapped_by


def test_a_wrappers_call_never_writes_over_its_networks_conflist_mode(tmp_path):
    """A conflist chains cni-reaper in observe mode and its portmap is wrapped too (the settings file says
    clean): each call notes its own mode in its own file, and the network stays observed (red team rt42)."""
    from cni_reaper.state.store import Store

    store = Store(str(tmp_path / "state"), 1).open()
    try:
        settings = file_with()
        for call in (Call("n", "observe"), Call("n", "clean", settings), Call("n", "observe"),
                     Call("n", "clean", settings)):
            noted = modes.network_modes(store, call)
            assert noted == ({"n": "observe"}, {"n": "clean"}) or noted == ({"n": "observe"}, {})
            assert modes.sources(*noted, settings).of("n") == "observe"
        assert modes.observing(store, Call("m", "clean", settings), "n")
    finally:
        store.close()


def test_a_0_5_0_modes_file_keeps_its_observe_after_the_upgrade(tmp_path):
    """0.5.0's wrapper noted its mode in .modes and "wrapped" in .wrapped; a conflist's call notes there too, and
    no later call can tell the two apart: an observe there stays (red team rt44: dropping it let a wrapped
    portmap's sweep clean a network its conflist observes); the wrapper's own word goes to .wrapped."""
    from cni_reaper.state.store import Store

    state = tmp_path / "state"
    store = Store(str(state), 1).open()
    try:
        for name, doc in ((modes.MODES, '{"w": "observe", "c": "observe"}'), (modes.WRAPPED, '{"w": "wrapped"}')):
            (state / name).write_text(doc)
            os.chmod(state / name, 0o600)
        settings = file_with(keys={"mode": "observe"})
        assert modes.network_modes(store, Call("w", "observe", settings)) == ({"w": "observe", "c": "observe"},
                                                                             {"w": "observe"})
        settings.keys = {}
        noted = modes.network_modes(store, Call("w", "clean", settings))
        assert noted[1] == {"w": "clean"}
        assert modes.sources(*noted, settings).of("w") == modes.sources(*noted, settings).of("c") == "observe"
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["torn", "list", "directory"])
def test_a_wrapped_file_that_cannot_be_read_observes_every_network_and_is_not_written_over(tmp_path, damage):
    """Red team rt44: a torn `.wrapped` read as "nothing wrapped" lost a wrapper's observe."""
    from cni_reaper.state.store import Store

    state = tmp_path / "state"
    store = Store(str(state), 1).open()
    try:
        where = state / modes.WRAPPED
        if damage == "directory":
            where.mkdir()
        else:
            where.write_text('{"w": "obs' if damage == "torn" else '["w"]')
            os.chmod(where, 0o600)
        noted = modes.network_modes(store, Call("w", "clean", file_with()))
        assert noted[1] is None
        assert modes.sources(*noted, file_with()).of("w") == modes.sources(*noted, None).of("other") == "observe"
        assert where.is_dir() or where.read_text() in ('{"w": "obs', '["w"]')  # not written over
    finally:
        store.close()


def test_a_modes_file_that_cannot_be_read_observes_every_network(tmp_path):
    from cni_reaper.state.store import Store

    store = Store(str(tmp_path / "state"), 1).open()
    try:
        (tmp_path / "state" / modes.MODES).write_text("{not json")
        os.chmod(tmp_path / "state" / modes.MODES, 0o600)
        known = modes.modes(store)
        assert modes.sources(known, {}, None).of("a") == modes.sources(known, {}, None).of("b") == "observe"
        modes.remember_mode(store, known, "a", "clean")  # not written over: the others' observe would be lost
        assert (tmp_path / "state" / modes.MODES).read_text() == "{not json"
        (tmp_path / "state" / modes.MODES).unlink()
        assert modes.modes(store) == {}  # none at all: nobody said observe
    finally:
        store.close()


def test_a_wrapper_whose_settings_file_cannot_be_used_observes():
    from cni_reaper.wrap.wrapper import conf_for

    conf = conf_for(b'{"cniVersion": "1.0.0", "name": "nomad", "type": "portmap"}', None, file_with(problem="bad"))
    assert conf is not None and conf["mode"] == "observe"


def test_a_link_that_cannot_be_looked_at_is_unseen_never_gone(monkeypatch):
    """CPython's if_nametoindex says "no interface" for every failure; the fall-back tells them apart. (A fake:
    the kernel cannot be made to refuse the look here.)"""
    import _socket

    from cni_reaper.reap import probes

    def nametoindex(name):
        raise OSError("no interface with this name")

    monkeypatch.setattr(_socket, "if_nametoindex", nametoindex)
    monkeypatch.setattr(_socket, "if_nameindex", lambda: [(1, "lo"), (7, "veth1")])
    assert probes.link_index("veth1") == 7 and probes.link_index("veth9") is None

    def failing():
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(_socket, "if_nameindex", failing)
    with pytest.raises(probes.Unseen):
        probes.link_index("veth1")
    assert not probes.veth_gone("veth1")


def test_a_damaged_boots_file_is_written_anew_and_the_first_call_of_a_boot_still_seen(tmp_path):
    """The first ADD of a boot makes libcni's cache forget dead addresses (orphans.cached_dead): a boots file
    that cannot be read must not turn that off for good."""
    from cni_reaper.state.store import Store

    store = Store(str(tmp_path / "state"), 1).open()
    try:
        booted = tmp_path / "state" / modes.BOOTED
        booted.write_text("\x00garbage")
        assert modes.first_of_boot(store, "nomad", "boot-1")
        assert not modes.first_of_boot(store, "nomad", "boot-1")
        assert modes.first_of_boot(store, "other", "boot-1")
        assert modes.first_of_boot(store, "nomad", "boot-2")
        booted.unlink()
        os.mkfifo(booted)
        assert modes.first_of_boot(store, "nomad", "boot-3")  # never blocks on a FIFO, and replaces it
        assert booted.is_file()
    finally:
        store.close()


def test_a_per_network_entry_that_is_not_an_object_observes_that_network():
    """Red team rt42: `"networks": {"N": "observe"}` (a string, a list, a bool) was dropped silently and N was
    cleaned; a value cni-reaper cannot use observes, and the file says why."""
    from cni_reaper.cni.settings_file import _take

    for bad in ("observe", ["observe"], True):
        s = SettingsFile("/etc/cni-reaper/config.json")
        _take(s, {"networks": {"N": bad, "M": {"mode": "clean"}}})
        assert s.for_network("N")["mode"] == "observe" and s.for_network("M")["mode"] == "clean"
        assert s.problem and "networks.N" in s.problem


def _cached(tmp_path, network: str, cid: str, entry: dict | None, config: object = None) -> str:
    """libcni's cache entry of (network, cid) whose cached conflist chains `entry` (None: bridge alone)."""
    import base64

    plugins = [{"type": "bridge"}] + ([entry] if entry is not None else [])
    if config is None:
        config = base64.b64encode(json.dumps({"cniVersion": "1.0.0", "name": network, "plugins": plugins}).encode()).decode()
    results = tmp_path / "cache" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{network}-{cid}-eth0").write_text(json.dumps(
        {"kind": "cniCacheV1", "containerId": cid, "config": config, "ifName": "eth0", "networkName": network}))
    return str(tmp_path / "cache")


@pytest.mark.parametrize("entry,config,want", [
    ({"type": "cni-reaper", "stateDir": "{state}"}, None, "clean"),
    ({"type": "cni-reaper", "stateDir": "{state}", "mode": "observe"}, None, "observe"),
    ({"type": "cni-reaper", "stateDir": "/var/lib/cni/reaper-watch"}, None, "observe"),  # another state directory
    ({"type": "cni-reaper"}, None, "observe"),  # the default state directory, not this one
    ({"type": "cni-reaper", "stateDir": "{state}", "mode": "clean", "Mode": "observe"}, None, "observe"),
    (None, None, None),  # no cni-reaper in its conflist: never chained (the finder's mode governs it)
    ({"type": "cni-reaper", "stateDir": "{state}"}, "not base64!", None),
    ({"type": "cni-reaper", "stateDir": "{state}"}, "bm90IGpzb24=", None),
], ids=["same-dir-clean", "same-dir-observe", "other-dir", "default-dir", "mode-twice", "no-reaper", "not-base64",
        "not-json"])
def test_the_mode_a_networks_cached_conflist_gives_it(tmp_path, entry, config, want):
    """A dead attachment found by another network's call, of a network no source here knows: its own
    conflist, as libcni cached it with the attachment, says whether it chains cni-reaper, where and how (red
    team rt50: an observed network with its own state directory was cleaned by a clean network's ADD)."""
    from cni_reaper.reap.cache import chained_modes

    state = str(tmp_path / "state")
    if entry is not None:
        entry = {k: v.format(state=state) if isinstance(v, str) else v for k, v in entry.items()}
    cache = _cached(tmp_path, "watch", "c1", entry, config)
    got = chained_modes(cache, [("watch", "c1")], state)
    readable = config is None
    assert got == ({} if want is None else {"watch": want}, {"watch"} if entry is None and readable else set())


def test_a_network_with_records_is_observed_until_its_own_call_says_its_mode(tmp_path):
    """`.modes` lost or removed (as its warning's fix says): a network that has records is observed by every
    other network's sweep until its own call notes its mode again (red team rt50). Clean is noted too."""
    from cni_reaper.state.store import Store

    store = Store(str(tmp_path / "state"), 1).open()
    try:
        modes.network_modes(store, Call("n", "clean"))
        assert json.loads((tmp_path / "state" / ".modes").read_text()) == {"n": "clean"}
        (tmp_path / "state" / ".modes").unlink()
        s = modes.sources(*modes.network_modes(store, Call("m", "clean")), None, finder="clean",
                          recorded=frozenset({"n"}))
        assert s.of("n") == "observe" and s.of("m") == "clean" and s.of("never-chained") == "clean"
        s = modes.sources(*modes.network_modes(store, Call("n", "clean")), None, finder="clean",
                          recorded=frozenset({"n"}))
        assert s.of("n") == "clean"
    finally:
        store.close()
