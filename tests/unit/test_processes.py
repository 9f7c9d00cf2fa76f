"""The backends' way of running the host's tools (reap/netfilter/processes.py), against real processes: what
`subprocess` gave them (output, errors, exit status, a timeout that leaves nothing running), and what a
restore of thousands of rules needs (a large stdin to a tool that writes before it reads, bytes that are no
UTF-8 given back as they were printed)."""

from __future__ import annotations

import os
import time

import pytest

from cni_reaper.reap.netfilter import processes as tools

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


PY_PROBE = """
import signal, sys
from cni_reaper.reap.netfilter import processes as tools
if sys.argv[1] == "ignored":
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as a runtime may pass it on across exec
done = tools.run(["/bin/sh", "-c", "echo hi; exit 3"])
print(done.code, done.out.strip())
"""


@pytest.mark.parametrize("sigchld", ["default", "ignored"])
def test_the_exit_status_is_read_whatever_sigchld_the_process_was_given(sigchld):
    """With SIGCHLD ignored the kernel reaps children itself: the tools' exit statuses are read all the same
    (from a red team: every save, restore and nft failed with ECHILD, nothing was cleaned)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", PY_PROBE, sigchld], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.stdout.split() == ["3", "hi"], proc.stdout + proc.stderr


def test_a_tool_that_closes_its_output_and_lives_on_is_bounded_by_the_timeout():
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        tools.run([SH, "-c", "exec >&- 2>&-; sleep 30"], timeout=0.5)
    assert time.monotonic() - started < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_a_descriptor_this_process_was_given_does_not_reach_the_tool(tmp_path):
    """As subprocess's close_fds: an inheritable descriptor (a runtime's lock, say) stays with us."""
    fd = os.open(str(tmp_path / "runtime-lock"), os.O_RDWR | os.O_CREAT)
    os.set_inheritable(fd, True)
    try:
        listed = tools.run([SH, "-c", "ls /proc/$$/fd"]).out.split()
    finally:
        os.close(fd)
    assert str(fd) not in listed and sorted(listed)[:3] == ["0", "1", "2"], listed


def test_no_descriptor_is_left_open_when_the_table_is_full():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = set(os.listdir("/proc/self/fd"))
    hold: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        while True:
            try:
                hold.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        for room in range(1, 5):  # room for the memfd, a pipe, ... but not for all of them
            for fd in hold[-room:]:
                os.close(fd)
            del hold[-room:]
            with pytest.raises(OSError):
                tools.run([SH, "-c", "cat"], "abc")
            hold += [os.open("/dev/null", os.O_RDONLY) for _ in range(room)]
    finally:
        for fd in hold:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert set(os.listdir("/proc/self/fd")) == before


WRAP_PROBE = """
import signal, sys
from cni_reaper.wrap import spawn
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as a runtime may pass it on across exec
code, out = spawn.run("/bin/grep", ["grep", "SigIgn", "/proc/self/status"], {}, b"")
print(code, out.decode().split()[1])
"""


def test_the_wrapper_reads_the_real_plugins_status_and_leaves_it_sigchld_as_the_runtime_gave_it():
    """Wrap mode's spawn (fork and exec, not tools.py): with SIGCHLD ignored its exit status is read all the
    same, and the real plugin still starts with SIGCHLD ignored, as it would run by the runtime directly."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", WRAP_PROBE], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    code, ignored = proc.stdout.split()
    assert code == "0" and int(ignored, 16) & (1 << (17 - 1)), proc.stdout + proc.stderr  # SIGCHLD is 17


def test_a_tool_run_while_a_lock_others_wait_for_is_held_ends_with_the_hold_and_none_starts_after():
    """files.holding (the state lock, host-local's locks): a tool that hangs is killed when the hold's time is
    spent, not at its own timeout; once it is spent no tool starts; with no lock held, the tool's own timeout;
    holds let go in another order than taken leave none behind."""
    from cni_reaper import files

    outer, inner = files.holding(1.0, "the test's lock"), files.holding(40, "another")
    with outer:
        inner.__enter__()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"within the 0\.5 s cni-reaper may hold the test's lock"):
            tools.run([SH, "-c", "exec sleep 30"], timeout=30)
        assert time.monotonic() - t0 < 15  # the hold's end, not the tool's own 30 s
        with pytest.raises(TimeoutError, match="not started: no time was left"):
            tools.run([SH, "-c", "exit 0"])
    assert files.hold_deadline() is not None and tools.run([SH, "-c", "exit 0"]).code == 0  # the inner one's 20 s
    inner.__exit__()
    inner.__exit__()  # twice: nothing
    assert files.hold_deadline() is None


def test_the_state_lock_and_host_locals_locks_are_held_with_tools_for_a_bounded_time(tmp_path):
    """Each lock other allocations wait for carries its hold, half of the time cni-reaper waits for it: the
    state lock (lockTimeout) and host-local's locks of networks (locked_dirs), from when they are taken to when
    they are let go."""
    from cni_reaper import files
    from cni_reaper.reap.hostlocal import locked_dirs
    from cni_reaper.state.store import Store

    (tmp_path / "ipam" / "net").mkdir(parents=True)
    store = Store(str(tmp_path / "state"), 4.0).open()
    try:
        with store.locked():
            end, what = files.hold_deadline() or (0.0, "")
            assert what == "within the 2 s cni-reaper may hold its state lock" and end - time.monotonic() <= 2
            with locked_dirs({(str(tmp_path / "ipam"), "net")}, 1.0):
                assert files.hold_deadline()[1] == "within the 0.5 s cni-reaper may hold host-local's locks"
                assert len(files._HELD) == 2
            assert len(files._HELD) == 1
    finally:
        store.close()
    assert files.hold_deadline() is None


def test_the_xtables_lock_is_waited_for_no_longer_than_the_hold_left(tmp_path, monkeypatch):
    """python-iptables' commits wait for the xtables lock (3 s): while a lock others wait for is held, no
    longer than its hold has left (found by a red team: two families waited 6 s under a 5 s hold)."""
    import fcntl

    from cni_reaper import files
    from cni_reaper.reap.netfilter.interface import LockHeld
    from cni_reaper.reap.netfilter.iptables import xtables_lock as xl

    path = tmp_path / "xtables.lock"
    monkeypatch.setattr(xl, "LOCK_PATH", str(path))
    other = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        with files.holding(0.4, "the test's lock"):
            t0 = time.monotonic()
            with pytest.raises(LockHeld, match=r"for more than 0\.[12]"), xl.xtables_lock(timeout=30):
                pass
            assert time.monotonic() - t0 < 10
    finally:
        os.close(other)
