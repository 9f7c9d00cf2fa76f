"""What steers root must be root's (issue 43, item 5): a settings file, a state directory, a journal or a log
file owned by another user, or writable by anyone but root, is refused with a clear line and never followed,
as sudo and systemd refuse theirs."""

from __future__ import annotations

import os

import pytest

from testkit.nomad import Client
from testkit.sandbox import ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
NOBODY = 65534


@pytest.fixture
def sb(tmp_path, flavour, package_exe, two_stacks):
    with open_sandbox(tmp_path, flavour, package_exe, two_stacks) as s:
        yield s


@pytest.mark.parametrize("how", ["owned-by-nobody", "group-writable"])
def test_a_settings_file_root_does_not_own_alone_steers_nothing(sb, how):
    """The wrapper's settings file names a root-owned 0755 state directory and a log file in a root-only
    directory: root cni-reaper neither tightens nor writes the one, nor creates the other; it says why in the
    default log, uses the defaults, and observes the wrapped network (a dead allocation's leftovers stay)."""
    elsewhere = sb.root / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    os.chmod(elsewhere, 0o755)
    private = sb.root / "root-only"
    private.mkdir(mode=0o700)
    client = Client(sb, settings={"stateDir": str(elsewhere), "logFile": str(private / "steered.log")})
    if how == "owned-by-nobody":
        os.chown(client.settings, NOBODY, NOBODY)
    else:
        os.chmod(client.settings, 0o664)
    dead, netns = unique("alloc-"), sb.container()
    ips = ips_of(client.driver("add", dead, netns, ("8080:80/tcp",)))
    sb.remove_container(netns)
    ips_of(client.driver("add", unique("alloc-"), sb.container(), ("8081:80/tcp",)))
    assert (os.stat(elsewhere).st_mode & 0o777, os.listdir(elsewhere)) == (0o755, [])
    assert os.listdir(private) == []
    said = (sb.var_log / "cni-reaper.log").read_text()
    assert "refused" in said and str(client.settings) in said
    assert sb.residue("nomad", dead, ips)  # observed: nothing of the wrapped network is removed


def test_a_log_file_root_does_not_own_alone_is_never_written(sb):
    log = sb.root / "theirs.log"
    log.write_text("")
    os.chown(log, NOBODY, NOBODY)
    conflist = sb.conflist(logFile=str(log))
    proc = sb.driver("add", unique("alloc-"), sb.container(), (), conflist)
    ips_of(proc)
    assert log.read_text() == ""
