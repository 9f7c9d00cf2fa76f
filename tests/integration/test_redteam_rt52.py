"""Red team rt52: today's judgement of modes (the facts `recorded` and `unchained`, the conflists libcni cached
with unrecorded targets) and undo's other-world refusal, attacked in throwaway namespaces with real iptables,
the reference plugins and go-cni. Tests that FAIL on main are breaks; those whose docstring says "held" passed."""

from __future__ import annotations

import json
import os

import pytest

from testkit.sandbox import Stack, ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
NOMAD = Stack("1.9", "go-cni-1.1.13")  # GC (CNI 1.1) needs libcni 1.3's runtime and the plugins 1.9


@pytest.fixture
def gsb(tmp_path, package_exe):
    with open_sandbox(tmp_path, "nft", package_exe, NOMAD) as s:
        yield s


def _settings(sb, **top) -> None:
    """A settings file of wrapped networks (wrap mode for some other network) with these top-level keys."""
    path = sb.root / "cni-reaper-config.json"
    path.write_text(json.dumps(top))
    os.chmod(path, 0o600)
    sb.extra_env["CNI_REAPER_CONFIG"] = str(path)



@pytest.mark.parametrize("leak", ["no-leak", "leak-from-before-installation"])
def test_gc_of_a_clean_network_cleans_its_recorded_attachments_whatever_its_leaks_from_before(gsb, leak):
    """Held (libcni's own GC DELs the leak's cached attachment first, so its conflist is no longer read: the
    network is not `unchained` by the time cni-reaper's GC runs). Promise: a clean network's dead attachments
    are cleaned (README modes: "A network that chains cni-reaper
    in a conflist has that conflist's mode"; only "a leak from before installation" is governed by the settings
    file's top level). nomad-reaper chains cni-reaper in clean mode. The operator also uses wrap mode for another
    network, trying it in observe: the settings file (CNI_REAPER_CONFIG) says top-level "mode": "observe".
    leak-from-before-installation: one allocation of nomad-reaper was made through the conflist without
    cni-reaper (before installation; host port 8311) and its netns is gone. Allocation R (recorded, host port
    8312) is no longer among the runtime's valid attachments; the runtime's GC of nomad-reaper names only K.
    Expected: R's rules, reservation and record go (GC's word: dead; its network is clean); the leak, governed by
    the top level, may stay. BREAK: with the leak, GC finds it (orphans.not_valid), its cached conflist chains
    no cni-reaper, so the whole NETWORK is `unchained` (judge/modes.py chained(): `network not in s.unchained`),
    the settings file's top-level observe governs every target of it, R included: nothing of R is removed, at
    every GC, for as long as the leak is there (and it stays: it is observed). no-leak: held, R cleaned.
    Reproduce: pytest tests/integration/test_redteam_rt52.py -k gc_of_a_clean; every time. Root cause:
    reap/sweep.py _with_cached_conflists/_watching decide per network; judge/modes.py chained() and mode_of."""
    sb = gsb
    _settings(sb, mode="observe")
    conf = sb.conflist()
    if leak != "no-leak":
        sb.leaked(sb.conflist(without_reaper=True), ("8311:80/tcp",))
    keep, keep_ns = unique("alloc-"), sb.container()
    assert sb.driver("add", keep, keep_ns, (), conf).returncode == 0
    cid, ns = unique("alloc-"), sb.container()
    out = sb.driver("add", cid, ns, ("8312:80/tcp",), conf)
    ips = ips_of(out)
    assert json.loads((sb.state_dir() / ".modes").read_text()).get(NET) == "clean"
    assert sb.residue(NET, cid, ips) and sb.record(cid) is not None
    for _ in range(2):
        gc = sb.driver("gc", conflist=conf, valid=(f"{keep}:eth0",))
        assert gc.returncode == 0, gc.stdout + gc.stderr
    assert (sb.record(cid), sb.residue(NET, cid, ips)) == (None, []), sb.log_file.read_text()[-2000:]


@pytest.mark.parametrize("orphans", [False, True])
def test_sweep_apply_orphans_cleans_a_clean_networks_recorded_dead_attachment(nsb, orphans):
    """Promise: a clean network's dead attachments are cleaned (README modes: "A network that chains cni-reaper
    in a conflist has that conflist's mode"; only "a leak from before installation" is governed by the settings
    file's top level) and `sweep --apply` removes what dead attachments left. nomad-reaper chains cni-reaper in
    clean mode (its conflist in the directory the CLI reads). The settings file of wrapped networks
    (CNI_REAPER_CONFIG; wrap mode tried on another network) says top-level "mode": "observe". One allocation of
    nomad-reaper was made before installation (the conflist without cni-reaper, host port 8321) and died; a
    recorded allocation R (host port 8322) died too (netns gone, no DEL). The operator runs
    `cni-reaper sweep --apply --orphans`. Expected: R's rules, reservation and record removed (the leak may stay,
    governed by the top level). BREAK (--orphans): the orphan's cached conflist chains no cni-reaper, so the whole
    network is `unchained` for the pass (judge/modes.py chained()) and the settings file's top-level observe
    governs R too: nothing of R removed, "observe mode" said of a network whose conflist says clean; without
    --orphans (held) R is cleaned. Reproduce: pytest tests/integration/test_redteam_rt52.py -k sweep_apply_orphans;
    every time. Root cause: the `unchained` fact is per network (reap/sweep.py _with_cached_conflists ->
    judge/modes.py chained(): `network not in s.unchained`), not per target."""
    sb = nsb
    _settings(sb, mode="observe")
    confdir = sb.root / "confs"
    confdir.mkdir()
    conf = sb.conflist()
    (confdir / "nomad-reaper.conflist").write_text(conf.read_text())
    sb.leaked(sb.conflist(without_reaper=True), ("8321:80/tcp",))
    cid, ips = sb.leaked(conf, ("8322:80/tcp",))
    assert sb.record(cid) is not None and sb.residue(NET, cid, ips)
    args = ["sweep", "--apply", *(["--orphans"] if orphans else []), "--cni-conf-dir", str(confdir)]
    out = sb.run([str(sb.plugin_dir / "cni-reaper"), *args])
    assert (sb.record(cid), sb.residue(NET, cid, ips)) == (None, []), (out.returncode, out.stdout[-2500:])
