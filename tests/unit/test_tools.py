"""The backends' way of running the host's tools (reap/netfilter/tools.py), against real processes: what
`subprocess` gave them (output, errors, exit status, a timeout that leaves nothing running), and what a
restore of thousands of rules needs (a large stdin to a tool that writes before it reads, bytes that are no
UTF-8 given back as they were printed)."""

from __future__ import annotations

import os
import time

import pytest

from cni_reaper.reap.netfilter import tools

SH = "/bin/sh"


def test_output_error_output_and_exit_status():
    done = tools.run([SH, "-c", 'echo out; echo err >&2; exit 3'])
    assert (done.code, done.out, done.err) == (3, "out\n", "err\n")


def test_a_large_stdin_to_a_tool_that_writes_a_lot_before_it_reads():
    text = "x" * (3 << 20)
    done = tools.run([SH, "-c", "head -c 2000000 /dev/zero; head -c 300000 /dev/zero >&2; wc -c"], text, timeout=20)
    assert done.code == 0 and len(done.err) == 300000
    assert done.out.endswith(f"{len(text)}\n") and len(done.out) == 2000000 + len(f"{len(text)}\n")


def test_bytes_that_are_no_utf8_come_back_as_they_were_printed():
    done = tools.run([SH, "-c", r"printf 'a\377b'; cat"], "c\udcfed")
    assert done.out == "a\udcffbc\udcfed" and done.out.encode("utf-8", "surrogateescape") == b"a\xffbc\xfed"


def test_the_tool_gets_the_signals_python_ignores_back_at_their_defaults_and_lc_all_c():
    done = tools.run([SH, "-c", "grep SigIgn /proc/self/status; echo $LC_ALL"])
    ignored = int(done.out.split()[1], 16)
    assert not ignored & (1 << (13 - 1)) and not ignored & (1 << (25 - 1)), done.out  # SIGPIPE, SIGXFSZ
    assert done.out.split()[2] == "C"


def test_a_tool_killed_by_a_signal_and_one_that_cannot_be_started():
    assert tools.run([SH, "-c", "kill -9 $$"]).code == -9
    with pytest.raises(OSError):
        tools.run(["/nonexistent/iptables-nft-save"])


def test_a_timeout_kills_the_tool_and_leaves_nothing_behind():
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        tools.run([SH, "-c", "echo $$ > /dev/stderr; exec sleep 30"], timeout=0.5)
    assert time.monotonic() - started < 5
    with pytest.raises(ChildProcessError):  # reaped: no child of ours is left, running or a zombie
        os.waitpid(-1, os.WNOHANG)


def test_several_tools_at_once_each_with_its_own_result():
    started = time.monotonic()
    done = tools.run_all([[SH, "-c", f"sleep 0.3; echo {i}; exit {i}"] for i in range(4)], ["", None, "x", None])
    assert [(d.code, d.out) for d in done] == [(i, f"{i}\n") for i in range(4)]
    assert time.monotonic() - started < 1.1  # side by side, not one after the other


def test_no_descriptor_is_left_open():
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(20):
        tools.run([SH, "-c", "cat"], "abc")
    with pytest.raises(TimeoutError):
        tools.run([SH, "-c", "exec sleep 30"], "abc", timeout=0.2)
    assert set(os.listdir("/proc/self/fd")) == before
