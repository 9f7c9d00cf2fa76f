"""Entry point: run under another plugin's name, the wrapper of that plugin (wrap/wrapper.py); else CNI mode when
CNI_COMMAND is set, the CLI when run with arguments, and a one-line about on stderr when run bare."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import NoReturn


def main() -> int:
    argv0 = sys.argv[0] if sys.argv else ""
    if os.environ.get("CNI_COMMAND"):
        _one_call()
    if not os.path.basename(argv0).startswith("cni-reaper"):  # perhaps run as another plugin's wrapper
        from cni_reaper.wrap.real import wrapped_name

        wrapped = wrapped_name(argv0)
        if wrapped is not None:
            from cni_reaper.wrap.wrapper import main as wrap_main

            _exit(wrap_main(wrapped))
    if os.environ.get("CNI_COMMAND"):
        if os.environ.get("CNI_REAPER_STAGES"):
            _exit(_staged())
        from cni_reaper.cni.shell import main_cni
        from cni_reaper.verbs.dispatch import dispatch

        _exit(main_cni(os.environ, dispatch))
    if len(sys.argv) > 1:
        from cni_reaper.tools.cli import main as cli_main

        return cli_main(sys.argv[1:])
    from cni_reaper.cni.shell import about
    from cni_reaper.cni.versions import SUPPORTED

    sys.stderr.write(f"{about()}\nCNI protocol versions supported: {', '.join(SUPPORTED)}\n")
    return 0


def _one_call() -> None:
    """A CNI call (chained or as a wrapper) is one short process that ends with os._exit: no cyclic garbage
    collection in it. What reference counting frees is freed as ever; what a cycle holds is given back at the
    exit. A sweep of 1,000 dead attachments makes a few hundred thousand objects (records, rules, journal
    items), and the collector walked them again and again: 30 to 60 ms of its CPU time (in process, Python
    3.11). The operator's commands keep the collector. Work kept for after the answer (cni/afterwards.py)
    goes to a child when the call ends (`_exit`)."""
    import gc

    import cni_reaper

    gc.disable()
    cni_reaper.one_call = True  # cni/afterwards.enable(), without loading it: most calls keep nothing


def _exit(code: int) -> NoReturn:
    """End a CNI call at once: its answer is written and flushed, its files are written with os.write and
    fsynced, its locks go with the process. The interpreter's orderly shutdown (every module torn down) would
    only add about 2 ms to every call."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            code = code or 1
    afterwards = sys.modules.get("cni_reaper.cni.afterwards")  # not loaded: no work was kept
    try:
        if afterwards is not None:
            afterwards.detach()
    except BaseException:  # noqa: BLE001 - the answer is written: work left undone never fails the call
        pass
    os._exit(code)


def _staged() -> int:
    """A CNI call that also writes on stderr when its stages began, in CLOCK_MONOTONIC nanoseconds: how
    scripts/bench.sh splits a start into interpreter, imports and work (set CNI_REAPER_STAGES=1)."""
    import time

    entered = time.monotonic_ns()
    from cni_reaper.cni.shell import main_cni
    from cni_reaper.verbs.dispatch import dispatch

    imported = time.monotonic_ns()
    code = main_cni(os.environ, dispatch)
    done = time.monotonic_ns()
    # and which of its modules were imported from their own files rather than the bundle's code index
    # (build/codeindex.py; outside the bundle: all of them)
    files = sorted(n for n, m in list(sys.modules.items())
                   if n.startswith("cni_reaper") and type(getattr(m, "__loader__", None)).__name__ != "CodeFinder")
    named = ", ".join(f'"{n}"' for n in files)  # module names need no escaping; json would import re (ms)
    sys.stderr.write(f'{{"stages": {{"main": {entered}, "imported": {imported}, "done": {done}, '
                     f'"from_files": [{named}]}}}}\n')
    return code


if __name__ == "__main__":
    sys.exit(main())
