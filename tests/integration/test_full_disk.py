"""cni-reaper's own bookkeeping on a file system that fills up (issue 43): the journal's intent is written
whole or nothing is removed."""

from __future__ import annotations

import json

import pytest

from testkit.mounts import fill, small_fs
from testkit.sandbox import ips_of, unique

pytestmark = pytest.mark.netns

NET = "nomad-reaper"


@pytest.fixture
def stack(two_stacks):
    return two_stacks


def test_a_clean_up_on_a_full_file_system_removes_nothing_it_could_not_journal(sb, tmp_path):
    """The journal's intent line does not fit in the state directory's file system (a page's slack is left):
    nothing of the dead allocation is removed, and `journal`/`undo` stay true; once there is room, the next
    sweep removes and journals it all, and undo can put it back. (Before: the line was cut at the slack, the
    clean-up went on, and `undo` said "nothing to put back".)"""
    with small_fs(tmp_path / "statefs", "512k") as fs:
        state = fs / "reaper"
        conflist = sb.conflist(stateDir=str(state))
        cli = ("--state-dir", str(state))
        first, netns = unique("alloc-"), sb.container()
        ips_of(sb.driver("add", first, netns, ("8096:80/tcp",), conflist))
        sb.remove_container(netns)
        dead, netns = unique("alloc-"), sb.container()
        ips = ips_of(sb.driver("add", dead, netns, ("8097:80/tcp",), conflist))
        # the journal exists (a first clean-up), then the file system is filled up to its pages' slack
        assert sb.cli("sweep", "--apply", *cli, "--network", NET).returncode == 0
        sb.remove_container(netns)
        before = sb.residue(NET, dead, ips)
        assert before
        fill(fs)
        out = sb.cli("sweep", "--apply", *cli)
        assert out.returncode in (0, 1, 4), out.stdout + out.stderr  # a clean-up that failed is said, never a traceback
        for line in (state / ".journal").read_bytes().splitlines():
            json.loads(line)  # no line cut short
        (fs / "filler").unlink()
        (fs / "filler-small").unlink()
        # whatever the full file system let go was journaled whole: undo puts all of it back
        undo = sb.cli("undo", dead, *cli)
        assert undo.returncode == 0, undo.stdout + undo.stderr
        assert sorted(sb.residue(NET, dead, ips)) == sorted(before), undo.stdout
        # with room, the next sweep removes and journals it all, and undo can put it back
        assert sb.cli("sweep", "--apply", *cli).returncode == 0
        assert sb.residue(NET, dead, ips) == []
        undo = sb.cli("undo", dead, *cli)
        assert undo.returncode == 0, undo.stdout + undo.stderr
        assert sorted(sb.residue(NET, dead, ips)) == sorted(before)
