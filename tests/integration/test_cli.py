"""The operator CLI in the same binary: list, sweep (dry run, --apply, --orphans), exit codes, the log file."""

from __future__ import annotations

import json

import pytest

from testkit.sandbox import ips_of, unique

pytestmark = pytest.mark.netns


@pytest.fixture
def stack(two_stacks):
    """cni-reaper's own machinery: the oldest and the newest stack suffice."""
    return two_stacks


def cli(sb, *args):
    """The CLI with no conflist to read (an empty conf dir, not the machine's): the defaults and the flags."""
    return sb.run([str(sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(sb.root / "no-conflists")])


def test_list_and_sweep_as_an_operator_would(sandbox):
    live, dead, orphan = unique("alloc-"), unique("alloc-"), unique("alloc-")
    netns_live, netns_dead, netns_orphan = sandbox.container(), sandbox.container(), sandbox.container()
    ips = {live: ips_of(sandbox.driver("add", live, netns_live, ("8080:80/tcp",))),
           dead: ips_of(sandbox.driver("add", dead, netns_dead, ("8081:80/tcp",))),
           # added before cni-reaper was in the chain: no record; libcni's cache still names its netns
           orphan: ips_of(sandbox.driver("add", orphan, netns_orphan, ("8082:80/tcp",),
                                         sandbox.conflist(without_reaper=True)))}
    sandbox.remove_container(netns_dead)
    assert orphan not in cli(sandbox, "sweep", "--orphans").stdout  # its netns is alive: not an orphan
    sandbox.remove_container(netns_orphan)

    listing = cli(sandbox, "list", "--json")
    assert listing.returncode == 0, listing.stderr
    states = {r["containerID"]: r["state"] for r in json.loads(listing.stdout)}
    assert states == {live: "live", dead: "dead"}
    table = cli(sandbox, "list").stdout
    assert table.splitlines()[0].split()[:3] == ["NETWORK", "CONTAINER", "ID"] and dead in table
    assert f"iptables: ipv4 {sandbox.flavour} (" in table and f"ipv6 {sandbox.flavour} (" in table

    live_rules = sandbox.residue("nomad-reaper", live, ips[live])
    before = sandbox.tables()
    dry = cli(sandbox, "sweep")
    assert dry.returncode == 3, dry.stdout + dry.stderr
    assert dead in dry.stdout and "would remove" in dry.stdout and orphan not in dry.stdout
    assert "masquerade chain" in dry.stdout and f"host-local reservation nomad-reaper/{ips[dead][0]}" in dry.stdout
    backend = "python-iptables" if sandbox.flavour == "legacy" else "iptables-nft-restore"
    assert f"backends: ipv4 {backend}" in dry.stdout
    assert sandbox.tables() == before, "a dry run changed the tables"
    assert dead in sandbox.reservations("nomad-reaper").values()
    dry_orphans = json.loads(cli(sandbox, "sweep", "--orphans", "--json").stdout)
    assert any(orphan in owner for owner in dry_orphans["attachments"]) and not dry_orphans["applied"]

    log_file = sandbox.root / "cli.log"
    applied = cli(sandbox, "sweep", "--apply", "--log-file", str(log_file))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # --apply removed exactly what the dry run listed
    listed = [l.strip() for l in dry.stdout.splitlines() if l.startswith("  - ")]
    removed = [l.strip() for l in applied.stdout.splitlines() if l.startswith("  - ")]
    assert sorted(listed) == sorted(removed)
    assert sandbox.residue("nomad-reaper", dead, ips[dead]) == []
    assert sandbox.residue("nomad-reaper", orphan, ips[orphan])  # not without --orphans
    lines = [json.loads(l) for l in log_file.read_text().splitlines()]
    assert any(l["msg"] == "removed" and l["containerID"] == dead for l in lines)

    assert cli(sandbox, "sweep", "--apply", "--orphans", "--log-file", str(log_file)).returncode == 0
    assert sandbox.residue("nomad-reaper", orphan, ips[orphan]) == []
    assert sandbox.residue("nomad-reaper", live, ips[live]) == live_rules

    again = cli(sandbox, "sweep")
    assert again.returncode == 0 and again.stdout.strip().startswith("0 item(s)")


def test_cli_usage_and_version(package_exe):
    import subprocess

    assert subprocess.run([package_exe, "version"], capture_output=True, text=True).stdout.startswith("cni-reaper ")
    assert subprocess.run([package_exe, "frob"], capture_output=True).returncode == 2
    assert subprocess.run([package_exe, "sweep", "--backend", "x"], capture_output=True).returncode == 2
    helptext = subprocess.run([package_exe, "sweep", "--help"], capture_output=True, text=True).stdout
    assert "--apply" in helptext and len(helptext.splitlines()) < 40


def _valid(name: str, document) -> None:
    """`document` validates against its published schema (docs/schemas/<name>.schema.json)."""
    import jsonschema

    from testkit.sandbox import REPO

    schema = json.loads((REPO / "docs" / "schemas" / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)


def test_every_json_output_follows_its_published_schema(sb):
    """Issue 44: `list`, `sweep`, `journal`, `undo` and `doctor` with --json print what docs/schemas/ publishes, and
    every item a real clean-up journals is a journal item of its schema; a document off its schema fails."""
    import jsonschema

    live, dead = unique("alloc-"), unique("alloc-")
    netns_dead = sb.container()
    sb.driver("add", live, sb.container(), ("8083:80/tcp",))
    sb.driver("add", dead, netns_dead, ("8084:80/tcp",))
    sb.remove_container(netns_dead)
    out = {}
    for name, args in (("list", ("list",)), ("sweep", ("sweep", "--apply")), ("journal", ("journal",)),
                       ("undo", ("undo", dead, "--dry-run")), ("doctor", ("doctor",))):
        run = cli(sb, *args, "--json")
        assert run.stdout.startswith(("[", "{")), (name, run.stdout, run.stderr)
        out[name] = json.loads(run.stdout)
        _valid(name, out[name])
    assert {r["containerID"] for r in out["list"]} == {live, dead} and out["sweep"]["count"] > 0
    kinds = {row["kind"] for row in out["journal"]}
    assert {"iptables", "reservation", "record"} <= kinds, kinds
    for row in out["journal"]:
        _valid("journal-item", row["item"])
    assert out["undo"]["restored"] and out["undo"]["dryRun"] is True
    with pytest.raises(jsonschema.ValidationError):  # the check can fail: a document off its schema
        _valid("list", [{**out["list"][0], "state": 3}])
    with pytest.raises(jsonschema.ValidationError):
        _valid("journal-item", {**out["journal"][0]["item"], "kind": "iptables", "family": 5})
