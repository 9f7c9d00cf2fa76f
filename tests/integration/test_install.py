"""scripts/install.sh into a throwaway root, and the Nomad guide files."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import hcl2
import pytest

from testkit.sandbox import REPO, binary_exe, reference_plugins

INSTALL = REPO / "scripts" / "install.sh"


def tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = "/" + str(p.relative_to(root))
        out[rel] = "link:" + os.readlink(p) if p.is_symlink() else ("dir" if p.is_dir() else "file")
    return out


def run(*args, check=True):
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, check=check)


def test_install_is_idempotent_and_uninstall_removes_only_what_it_installed(tmp_path):
    bundle = binary_exe()
    root = tmp_path / "root"
    (root / "opt" / "cni" / "bin").mkdir(parents=True)
    (root / "opt" / "cni" / "bin" / "someone-elses-plugin").write_text("#!/bin/sh\n")
    before = tree(root)
    args = ["--prefix", str(root), "--bundle", os.path.dirname(bundle)]
    run(*args)
    first = tree(root)
    run(*args)
    assert tree(root) == first, "a second install changed the tree"
    link = root / "opt" / "cni" / "bin" / "cni-reaper"
    assert first["/opt/cni/bin/cni-reaper"] == "link:../../cni-reaper/cni-reaper"
    assert subprocess.run([str(link), "version"], capture_output=True, text=True).stdout.startswith("cni-reaper ")
    installed = json.loads((root / "opt" / "cni" / "config" / "nomad-reaper.conflist").read_text())
    assert installed["plugins"][-1]["type"] == "cni-reaper"
    run(*args, "--uninstall")
    assert tree(root) == before


def test_install_with_timer_ships_the_units_not_enabled_and_uninstall_takes_them_back(tmp_path):
    """--timer copies the sweep's timer and service into /etc/systemd/system (listed in the manifest), enables
    nothing; --uninstall removes them, an operator's `systemctl enable` link with them, and only the
    directories it made."""
    bundle = binary_exe()
    root = tmp_path / "root"
    (root / "opt" / "cni" / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("client\n")
    before = tree(root)
    args = ["--prefix", str(root), "--bundle", os.path.dirname(bundle), "--timer"]
    out = run(*args).stdout
    assert "systemctl enable --now cni-reaper-sweep.timer" in out
    first = tree(root)
    run(*args)
    assert tree(root) == first, "a second install changed the tree"
    units = root / "etc" / "systemd" / "system"
    for name in ("cni-reaper-sweep.service", "cni-reaper-sweep.timer"):
        assert (units / name).read_bytes() == (REPO / "conflist" / "systemd" / name).read_bytes()
    assert not [p for p in first if ".wants" in p], "the timer was enabled"
    manifest = (root / "opt" / "cni-reaper" / ".manifest").read_text()
    assert "file /etc/systemd/system/cni-reaper-sweep.timer " in manifest
    run(*args[:-1])  # a later install without --timer keeps the units it installed before, and their entries
    assert "file /etc/systemd/system/cni-reaper-sweep.timer " in (root / "opt" / "cni-reaper" / ".manifest").read_text()
    (units / "timers.target.wants").mkdir()
    (units / "timers.target.wants" / "cni-reaper-sweep.timer").symlink_to("../cni-reaper-sweep.timer")  # enabled
    run("--prefix", str(root), "--uninstall")
    assert tree(root) == before


def test_install_with_wrap_makes_the_wrapper_directory_and_uninstall_waits_for_cni_path(tmp_path):
    """--wrap: /opt/cni-reaper/wrap/portmap, a link to cni-reaper that, run bare as Nomad's fingerprint runs it
    (no CNI_PATH: the settings' cniPath), answers exactly as the real portmap; the cni_path line is printed; a
    later install without --wrap keeps it; --uninstall refuses while the Nomad client's cni_path names the
    directory (Nomad before 2.0 stops fingerprinting at a missing one), and once it does not, leaves the tree
    as it was."""
    bundle = binary_exe()
    root = tmp_path / "root"
    (root / "opt" / "cni" / "bin").mkdir(parents=True)
    nomad = root / "etc" / "nomad.d"
    nomad.mkdir(parents=True)
    (nomad / "client.hcl").write_text('client {\n  cni_path = "/opt/cni/bin:/usr/lib/cni"\n}\n')
    before = tree(root)
    args = ["--prefix", str(root), "--bundle", os.path.dirname(bundle), "--conflist", "none"]
    out = run(*args, "--wrap").stdout
    assert 'cni_path = "/opt/cni-reaper/wrap:/opt/cni/bin:/usr/lib/cni"' in out
    assert "/opt/cni/config/none" not in out
    first = tree(root)
    assert first["/opt/cni-reaper/wrap/portmap"] == "link:../cni-reaper"
    run(*args)
    assert tree(root) == first, "an install without --wrap took the wrap away (or changed the tree)"
    settings = tmp_path / "config.json"
    settings.write_text(json.dumps({"cniPath": str(reference_plugins())}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    real = subprocess.run([str(reference_plugins() / "portmap")], env=env, capture_output=True, text=True)
    wrapped = subprocess.run([str(root / "opt" / "cni-reaper" / "wrap" / "portmap")], capture_output=True, text=True,
                             env={**env, "CNI_REAPER_CONFIG": str(settings)})
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (real.returncode, real.stdout, real.stderr)
    assert "portmap" in real.stderr
    (nomad / "client.hcl").write_text('client {\n  cni_path = "/opt/cni-reaper/wrap:/opt/cni/bin"\n}\n')
    refused = run("--prefix", str(root), "--uninstall", check=False)
    assert refused.returncode == 1 and "take it out" in refused.stderr, refused
    assert tree(root)["/opt/cni-reaper/wrap/portmap"] == "link:../cni-reaper"
    (nomad / "client.hcl").write_text('client {\n  cni_path = "/opt/cni/bin:/usr/lib/cni"\n}\n')
    run("--prefix", str(root), "--uninstall")
    assert tree(root) == before


def test_install_refuses_when_a_chained_plugin_is_missing(tmp_path):
    conf = json.loads((REPO / "conflist" / "nomad-reaper.conflist").read_text())
    conf["plugins"].insert(1, {"type": "no-such-plugin"})
    bad = tmp_path / "bad.conflist"
    bad.write_text(json.dumps(conf))
    proc = run("--prefix", str(tmp_path / "root"), "--bundle", str(tmp_path), "--conflist", str(bad), check=False)
    assert proc.returncode == 1
    assert "no-such-plugin" in proc.stderr or "no bundle" in proc.stderr


def _load(path: Path) -> dict:
    with open(path) as f:
        return hcl2.load(f)


def _unquote(v):
    return v.strip('"') if isinstance(v, str) else v


def test_the_sweep_job_is_a_sysbatch_raw_exec_job_running_sweep_apply():
    doc = _load(REPO / "conflist" / "nomad" / "cni-reaper-sweep.nomad.hcl")
    [job] = doc["job"]
    [(name, body)] = job.items()
    assert _unquote(name) == "cni-reaper-sweep" and _unquote(body["type"]) == "sysbatch"
    assert body["periodic"][0]["prohibit_overlap"] is True
    [group] = body["group"]
    [(_, g)] = group.items()
    [task] = g["task"]
    [(_, t)] = task.items()
    assert _unquote(t["driver"]) == "raw_exec"
    config = t["config"][0]
    assert _unquote(config["command"]) == "/bin/sh" and json.loads(config["args"][0]) == "-c"
    script = json.loads(config["args"][1])  # an HCL string literal (its escapes are JSON's)
    assert "/opt/cni/bin/cni-reaper sweep --apply --orphans" in script and "metrics --textfile" in script
    # no key of a conflist repeated: the CLI reads them from the conflists
    assert not any(flag in script for flag in ("--state-dir", "--ipam-data-dir", "--cni-cache-dir", "--backend",
                                               "--log-file", "--network"))
    assert _unquote(t["env"][0]["TEXTFILE_DIR"]).startswith("/")


def test_the_example_job_uses_the_shipped_conflist_by_name():
    doc = _load(REPO / "conflist" / "nomad" / "example-job.nomad.hcl")
    [(_, job)] = doc["job"][0].items()
    [(_, group)] = job["group"][0].items()
    mode = _unquote(group["network"][0]["mode"])
    names = {json.loads(p.read_text())["name"] for p in (REPO / "conflist").glob("*.conflist")}
    assert mode.startswith("cni/") and mode[4:] in names
    client = _load(REPO / "conflist" / "nomad" / "client.hcl")
    c = client["client"][0]
    assert "/opt/cni/bin" in _unquote(c["cni_path"]) and _unquote(c["cni_config_dir"]) == "/opt/cni/config"


def test_every_shipped_conflist_ends_with_cni_reaper_declaring_port_mappings():
    for path in (REPO / "conflist").glob("*.conflist"):
        conf = json.loads(path.read_text())
        last = conf["plugins"][-1]
        assert last["type"] == "cni-reaper", path
        assert last.get("capabilities", {}).get("portMappings") is True, path


@pytest.mark.parametrize("plugins,form", [("1.1.1", "1.0.0"), ("1.9", "1.1.0")])
def test_install_picks_the_conflist_form_the_installed_plugins_speak(tmp_path, plugins, form):
    """Plugins 1.6+ speak CNI 1.1.0 (and so get STATUS from Nomad 1.9.5+); Debian 12's 1.1.1 do not."""
    bundle = binary_exe()
    root = tmp_path / "root"
    bindir = root / "opt" / "cni" / "bin"
    bindir.mkdir(parents=True)
    if plugins != "1.1.1":  # the downloaded release in /opt/cni/bin, as Nomad's docs install it
        try:
            source = reference_plugins(plugins)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        for plugin in source.iterdir():
            (bindir / plugin.name).symlink_to(plugin)
    for name in ("nomad-reaper.conflist", "nomad-reaper-dualstack.conflist"):
        proc = run("--prefix", str(root), "--bundle", os.path.dirname(bundle), "--conflist", str(REPO / "conflist" / name))
        assert f"conflist {name} in its CNI {form} form" in proc.stdout, proc.stdout
        installed = json.loads((root / "opt" / "cni" / "config" / name).read_text())
        assert installed["cniVersion"] == form
    forced = run("--prefix", str(root), "--bundle", os.path.dirname(bundle), "--cni-version", "1.0.0", "--force")
    assert "asked for with --cni-version" in forced.stdout
    assert json.loads((root / "opt" / "cni" / "config" / "nomad-reaper.conflist").read_text())["cniVersion"] == "1.0.0"
    run("--prefix", str(root), "--uninstall")  # both conflists go, the plugins stay
    assert sorted(p.name for p in root.rglob("*")) == sorted(["opt", "cni", "bin"] + [p.name for p in bindir.iterdir()])


def test_the_two_forms_of_each_shipped_conflist_differ_only_in_their_version():
    for new in (REPO / "conflist" / "1.1.0").glob("*.conflist"):
        old = json.loads((REPO / "conflist" / new.name).read_text())
        new_doc = json.loads(new.read_text())
        assert (old.pop("cniVersion"), new_doc.pop("cniVersion")) == ("1.0.0", "1.1.0")
        assert old == new_doc, new.name
