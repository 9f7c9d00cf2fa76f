"""Issue 44: the settings file of wrapped networks is declared once, by models.SettingsFile (cni-reaper's own keys,
models.ReaperKeys, shared with the conflist entry): every wrapped call's plain reader picks its keys by the tables
generated from it (tests/unit/test_generated.py), and `cni-reaper doctor` checks the whole file against it."""

from __future__ import annotations

import json
import os

import pytest


def _file(tmp_path, doc) -> str:
    d = tmp_path / "etc"
    d.mkdir(mode=0o700)
    path = d / "config.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.chmod(path, 0o600)
    return str(path)


def test_doctor_finds_every_key_of_the_settings_file_a_wrapped_call_cannot_use(tmp_path):
    from cni_reaper.tools.doctor import WARN, check_settings_file

    path = _file(tmp_path, {"MODE": "obsrve", "stateDir": "relative/dir", "wrapTimeout": 0,
                            "networks": {"nomad": {"lockTimeout": "ten", "mode": "observe"}, "other": 7}})
    [f] = check_settings_file(path)
    assert f.status == WARN and f.source == path
    for where in ("mode:", "stateDir:", "wrapTimeout:", "networks.nomad.lockTimeout:", "networks.other:"):
        assert where in f.message, (where, f.message)
    assert "networks.nomad.mode" not in f.message  # what is usable is not named


@pytest.mark.parametrize("doc", [{}, {"mode": "Observe", "networks": {"nomad": {"StateDir": "/var/lib/x"}},
                                      "cniPath": "/opt/cni/bin", "wrapTimeout": 30, "unknownKey": 1}])
def test_doctor_says_a_settings_file_whose_keys_are_all_usable_is_so(tmp_path, doc):
    """Keys match in any case, as the conflist's do; keys cni-reaper does not know are no problem."""
    from cni_reaper.tools.doctor import OK, check_settings_file

    [f] = check_settings_file(_file(tmp_path, doc))
    assert f.status == OK, f.message


def test_doctor_says_why_a_settings_file_cannot_be_read_and_nothing_of_a_missing_one(tmp_path):
    from cni_reaper.tools.doctor import FAIL, check_settings_file

    assert check_settings_file(str(tmp_path / "none.json")) == []
    [f] = check_settings_file(_file(tmp_path, "[1, 2]"))
    assert f.status == FAIL and "not a JSON object" in f.message


def test_the_wrapped_calls_reader_and_the_model_agree_on_which_keys_are_the_settings_files(tmp_path):
    """What the plain reader keeps of a file (its top level, each network) is what the model names: a key the
    model does not declare is dropped by both."""
    from cni_reaper.cni.settings_file import load
    from cni_reaper.models import ReaperKeys, SettingsFile

    doc = {"stateDir": "/s", "LOGFILE": "/l", "extra": 1, "cniPath": "/opt/cni/bin",
           "networks": {"nomad": {"mode": "observe", "BACKEND": "nft", "extra": 2}}}
    s = load({"CNI_REAPER_CONFIG": _file(tmp_path, doc)})
    assert not s.problem
    model = SettingsFile.model_validate(doc)
    own = set(ReaperKeys.model_fields)
    assert s.keys == {k: getattr(model, k) for k in model.model_fields_set & own}
    assert s.for_network("nomad") == {**s.keys, **{k: getattr(model.networks["nomad"], k)
                                                    for k in model.networks["nomad"].model_fields_set}}
    assert s.cni_path == model.cniPath


def test_a_network_named_twice_in_the_settings_file_observes_and_doctor_fails_it(tmp_path):
    """Go keeps the last of a map's keys given twice; which one the operator meant is not known (the first
    may be an observe): every wrapped network observes, and doctor names the key."""
    from cni_reaper.cni.settings_file import load
    from cni_reaper.state.modes import sources
    from cni_reaper.tools.doctor import FAIL, check_settings_file

    path = _file(tmp_path, '{"networks": {"nomad": {"mode": "observe"}, "nomad": {"mode": "clean"}}}')
    s = load({"CNI_REAPER_CONFIG": path})
    assert s.problem and sources({}, {}, s).of("nomad") == "observe"
    [f] = check_settings_file(path)
    assert f.status == FAIL and "nomad" in f.message
