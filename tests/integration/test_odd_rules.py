"""Rules of someone else's whose comments hold what a line reader could trip on (from a red team): a
character that str.splitlines() takes for a line's end (form feed, U+2028, ...) printed raw by iptables-save,
followed by text that looks like a rule. Read as two lines, a phantom rule shifted the positions of every
later rule of the chain, and the legacy backend (python-iptables deletes by position, checked against the
same reading) removed a live neighbour's masquerade jump instead of the dead one's."""

from __future__ import annotations

import subprocess

import pytest

from testkit.sandbox import ips_of, open_sandbox, unique

pytestmark = pytest.mark.netns
PORTS = ("8080:80/tcp",)


def _raw(sb, argv, stdin=None):
    return subprocess.run(sb.wrap(argv), env=sb.env(), capture_output=True, input=stdin)


def _postrouting(sb):
    out = _raw(sb, [str(sb.bin_dir / "iptables-save"), "-t", "nat"]).stdout
    return [line for line in out.split(b"\n") if line.startswith(b"-A POSTROUTING ")]


@pytest.mark.parametrize("sep", [b"\x0c", b"\x1c", b"\xe2\x80\xa8", b"\xc2\x85"], ids=["ff", "fs", "u2028", "nel"])
def test_a_comment_with_a_line_break_like_character_shifts_nothing(tmp_path, flavour, package_exe, sep):
    with open_sandbox(tmp_path, flavour, package_exe) as sb:
        conflist = sb.conflist()
        dead, dead_ns = unique("alloc-"), sb.container()
        live, live_ns = unique("alloc-"), sb.container()
        dead_ips = ips_of(sb.driver("add", dead, dead_ns, PORTS, conflist))
        ips_of(sb.driver("add", live, live_ns, ("9090:90/tcp",), conflist))
        odd = (b'*nat\n-I POSTROUTING 1 -d 10.9.9.9/32 -m comment --comment "note' + sep
               + b'-A POSTROUTING -j RETURN" -j RETURN\nCOMMIT\n')
        assert _raw(sb, [str(sb.bin_dir / "iptables-restore"), "--noflush"], odd).returncode == 0
        before = _postrouting(sb)
        assert [line for line in before if live.encode() in line] and [line for line in before if sep in line]
        sb.remove_container(dead_ns)
        assert sb.driver("del", dead, dead_ns, PORTS, conflist).returncode == 0
        assert sb.status()[0] == 0
        after = _postrouting(sb)
        assert after == [line for line in before if dead.encode() not in line], (before, after)
        assert sb.residue("nomad-reaper", dead, dead_ips) == []
