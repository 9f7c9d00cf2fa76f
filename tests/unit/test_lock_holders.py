"""Who holds a lock (files.holders_stopped): STATUS waits for the state lock before a recreate, but never for a
holder that is stopped (a suspended `cni-reaper sweep`): it lets go of nothing until someone resumes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from cni_reaper.files import holders_stopped

HOLD = ("import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(60)")


def test_a_stopped_holder_is_told_from_a_running_one_and_from_none(tmp_path):
    lock = tmp_path / ".lock"
    lock.touch()
    assert not holders_stopped(str(lock))  # nobody holds it
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        assert not holders_stopped(str(lock))  # running: it will let go
        p.send_signal(signal.SIGSTOP)
        # the stop is delivered asynchronously: the kernel tells the parent once the child is stopped (its state
        # is set before), so the wait ends exactly then, however loaded the machine is
        assert os.WIFSTOPPED(os.waitpid(p.pid, os.WUNTRACED)[1])
        assert holders_stopped(str(lock))
        p.send_signal(signal.SIGCONT)  # a stopped task is woken by the sending kill itself
        assert os.WIFCONTINUED(os.waitpid(p.pid, os.WCONTINUED)[1])
        assert not holders_stopped(str(lock))
    finally:
        p.kill()
        p.wait()
    assert not holders_stopped(str(tmp_path / "gone"))  # no such file: not known, so no
