"""Work a CNI call keeps for after its answer (cni/afterwards.py): it never fails the call, in process or not.
Both cases were found by a review of the detached look (issue 32): a look run inside the ADD's own state lock
waited for that lock, and a detach that fails after the answer exited 1."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# a CNI call's last steps, as main.py takes them: the answer written, then `_exit` with work kept for later
CALL = textwrap.dedent("""
    import sys
    from cni_reaper import main
    from cni_reaper.cni import afterwards

    afterwards.enable()
    afterwards.later(lambda: None, sys.argv[1])
    sys.stdout.write('{"cniVersion": "1.0.0"}\\n')
    main._exit(0)
""")


@pytest.mark.netns  # a private mount namespace (unshare -m): the machine's /dev is not touched
def test_a_detach_that_cannot_open_dev_null_still_ends_the_call_with_its_answer_and_code(tmp_path):
    """A client whose runtime runs plugins with no /dev/null in their view (a minimal container, a damaged
    /dev): the answer is written and the call exits 0; the work is simply not done."""
    script = tmp_path / "call.py"
    script.write_text(CALL)
    proc = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs none /dev && exec "$0" "$1" "$2"',
                           sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, '{"cniVersion": "1.0.0"}\n', "")


def test_work_kept_outside_a_cni_call_runs_at_once(tmp_path):
    """The operator's commands and a verb called in process do the work at once (no child, nothing pending)."""
    from cni_reaper.cni import afterwards

    done = []
    afterwards.later(lambda: done.append(1), str(tmp_path))
    assert done == [1] and afterwards._pending == []
