"""Wrap mode: cni-reaper run under the name of another plugin (a link named `portmap` in a directory put first
on the client's cni_path) is that plugin's wrapper, for a network whose conflist cannot chain it (Nomad's own
`bridge` network, built in memory).

- The real plugin of that name is found on CNI_PATH (the first that is not cni-reaper: wrap/real.py), run
  with the same argv, environment and stdin, and its stdout, stderr and exit status are returned unchanged:
  to the runtime the wrapper is that plugin. Run with no CNI_COMMAND (Nomad's fingerprint), it is run just
  the same, so the version Nomad records is the real plugin's.
- cni-reaper's own work happens beside it, as when it is chained last: ADD (once the real plugin succeeded)
  records the attachment from the result the real plugin returned and runtimeConfig.portMappings, and
  sweeps; DEL does first what of the attachment must go before the real plugin's DEL (cni-reaper runs first
  in a DEL when chained last too), and when nothing must (the common case) its whole DEL (the tombstone, the
  sweep) runs while the real plugin runs; CHECK, STATUS and GC do theirs after a real answer that succeeded,
  their modules imported while the real plugin runs. Its settings come from the settings file
  (cni/settings_file.py), never from the wrapped plugin's own keys.
- That work never changes the outcome: whatever it meets (an unusable state directory or settings file, a
  lock never free, an exception) is logged and dropped, and it is bounded in time (wrapTimeout, default
  10 s): Nomad serialises a client's network setup and teardown and gives plugins no timeout.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

from cni_reaper import jsonio
from cni_reaper.cni.settings_file import SettingsFile, load
from cni_reaper.wrap import real, spawn

# what the runtime hands every plugin (libcni puts them into each entry), as opposed to the wrapped plugin's keys
FROM_THE_RUNTIME = ("cniVersion", "cniVersions", "name", "runtimeConfig", "capabilities", "prevResult",
                    "cni.dev/valid-attachments", "cni.dev/attachments")


class Budget(BaseException):
    """cni-reaper's own work ran out of its time in this call (a BaseException: the `except Exception` of a
    clean-up or a sweep, which keeps a verb going past a failure, must not keep it going past its time)."""


# the verbs whose own part follows the real plugin's answer (DEL's comes before it)
AFTER = ("ADD", "CHECK", "STATUS", "GC")

# the modules each verb's own part imports, loaded while the real plugin runs (on a second core the import
# costs the call nothing); only modules, nothing that reads or writes state, so the plugin sees the host as
# it would have alone
PREPARE = {"ADD": ("cni_reaper.verbs.add", "cni_reaper.reap.sweep"), "CHECK": ("cni_reaper.verbs.check",),
           "STATUS": ("cni_reaper.verbs.status",), "GC": ("cni_reaper.verbs.gc",)}

# the cni-reaper files (device:inode, comma-separated) already wrapping this call: a second cni-reaper (a .deb
# beside a tarball, an old copy) with its own wrapper directory on the path is passed over, not run in a loop
NESTED = "CNI_REAPER_WRAPPERS"


def main(name: str) -> int:
    env = dict(os.environ)
    settings = load(env)
    command = env.get("CNI_COMMAND", "")
    stdin = _read_all(0) if command else b""
    outer = _identities(env.get(NESTED, ""))
    own = real.own_identities() | outer
    plugin = real.find(name, real.search_path(env, settings.cni_path), own)
    if plugin is None:
        return _not_found(name, env, settings, command)
    mine = not outer  # the outermost wrapper of a call does cni-reaper's part; one nested in it only passes on
    own_part = Own(command, env, settings)
    if mine and command == "DEL":
        own_part.run(stdin, None)
    after = mine and command in AFTER
    meanwhile = (lambda: _prepare(command)) if after else own_part.later if own_part.beside else None
    try:
        code, out = spawn.run(plugin, [plugin, *sys.argv[1:]], {**env, NESTED: _ids(own)}, stdin, meanwhile)
    except spawn.ExecFailed as exc:
        return _cannot_run(name, plugin, exc.args[0], command)
    if after and code == 0:
        own_part.run(stdin, out)
    return _answer(code, out)


def _answer(code: int, out: bytes) -> int:
    """Hand the real plugin's answer on: its output, then its exit (a signal that killed it kills the wrapper,
    so that the runtime sees what it would have seen)."""
    try:
        os.write(1, out) if out else None
    except OSError:
        return code if code > 0 else 1
    if code < 0:
        _die_of(-code)
        return 128 - code  # a signal that does not end a process by default
    return code


def _prepare(command: str) -> None:
    """What the own part of `command` will import, imported while the real plugin runs."""
    import io  # noqa: F401 - for _serve

    from cni_reaper import log  # noqa: F401
    from cni_reaper.cni import conf, shell  # noqa: F401
    from cni_reaper.verbs import dispatch  # noqa: F401

    for name in PREPARE.get(command, ()):
        __import__(name)


def _read_all(fd: int) -> bytes:
    """All of stdin, as the real plugin would have read it (a closed one reads as empty)."""
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        pass
    return b"".join(chunks)


def _identities(text: str) -> set[tuple[int, int]]:
    out = set()
    for item in text.split(","):
        dev, _, ino = item.partition(":")
        if dev.isdigit() and ino.isdigit():
            out.add((int(dev), int(ino)))
    return out


def _ids(idents: set[tuple[int, int]]) -> str:
    return ",".join(f"{d}:{i}" for d, i in sorted(idents))


def _quiet(settings: SettingsFile, env: Mapping[str, str]) -> None:
    """The wrapper's stderr is the real plugin's alone: cni-reaper's own lines go to its log file only."""
    from cni_reaper import log
    from cni_reaper.cni.conf import DEFAULT_LOG_FILE

    log.never_to_stderr()
    given = settings.keys.get("logFile")
    usable = isinstance(given, str) and (given == "" or given.startswith("/"))  # "": no log file, as in a conflist
    log.begin(given if usable else DEFAULT_LOG_FILE, stderr=False,
              verb=env.get("CNI_COMMAND", ""), containerID=env.get("CNI_CONTAINERID", ""))


def _die_of(signum: int) -> None:
    import _signal as signal  # not `signal`: it imports enum

    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), signum)


def _cannot_run(name: str, plugin: str, errno: int, command: str) -> int:
    return _fail(f"cni-reaper wraps {name}, but {plugin} cannot be run: {os.strerror(errno)}",
                 f"reinstall the reference plugins' {name} there (the runtime alone would fail the same way)", command)


def _fail(msg: str, fix: str, command: str) -> int:
    """A failure of the wrapper itself: CNI error 5 on stdout for a CNI call, a line on stderr for a bare run."""
    if command:
        os.write(1, jsonio.dumps({"cniVersion": "1.1.0", "code": 5, "msg": msg, "details": fix}).encode())
    else:
        sys.stderr.write(f"{msg}: {fix}\n")
    return 1


def _not_found(name: str, env: Mapping[str, str], settings: SettingsFile, command: str) -> int:
    where = ":".join(real.search_path(env, settings.cni_path)) or "(an empty path)"
    return _fail(f"cni-reaper wraps {name}, but no {name} plugin other than cni-reaper is in {where}",
                 f"install the reference plugins there, or put the wrapper's directory first and the plugins' after "
                 f"it in Nomad's client cni_path (and set cniPath in {settings.path} for runs without CNI_PATH)", command)


def conf_for(stdin: bytes, result: bytes | None, settings: SettingsFile) -> dict[str, Any] | None:
    """cni-reaper's configuration for this call: what the runtime hands every plugin (the network's name and
    version, runtimeConfig, the capabilities of the wrapped entry, prevResult: for ADD the real plugin's
    result), and cni-reaper's own keys from the settings file, never the wrapped plugin's (portmap's
    `backend` is not cni-reaper's)."""
    from cni_reaper.gojson import pick

    try:
        given = jsonio.loads(stdin)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    if not isinstance(given, dict):
        return None
    v = pick(given, FROM_THE_RUNTIME, ("cniVersions", "prevResult", "capabilities", "cni.dev/valid-attachments",
                                       "cni.dev/attachments"))
    name = v.get("name")
    conf = {**settings.for_network(name if isinstance(name, str) else ""), **v, "type": "cni-reaper"}
    if settings.problem:  # the file cannot be used: whatever it says of modes is not known, so observe
        conf["mode"] = "observe"
    if result is not None:
        try:
            conf["prevResult"] = jsonio.loads(result)
        except (ValueError, RecursionError, UnicodeDecodeError):
            return None
    return conf


class Own:
    """cni-reaper's own part of one call, which never changes its outcome and is bounded in time: wrapTimeout
    for all of it, whether it runs at once (`run`) or partly beside the real plugin (`later`: what the verb
    left for then, e.g. DEL's sweep of the other attachments)."""

    def __init__(self, command: str, env: dict[str, str], settings: SettingsFile) -> None:
        self.command, self.env, self.settings = command, env, settings
        self.beside: list[Callable[[], None]] = []
        self.budget = settings.wrap_timeout

    def run(self, stdin: bytes, result: bytes | None) -> None:
        def serve() -> None:
            _quiet(self.settings, self.env)
            conf = conf_for(stdin, result if self.command == "ADD" else None, self.settings)
            if conf is not None:
                _serve(self.command, conf, self.env, self.settings, self.beside)

        self._within_budget(serve)

    def later(self) -> None:
        def work() -> None:
            for job in self.beside:
                job()

        self._within_budget(work)

    def _within_budget(self, work: Callable[[], None]) -> None:
        import _signal as signal  # not `signal`: it imports enum, milliseconds on every call
        import time

        def out_of_time(signum: int, frame: Any) -> None:
            raise Budget()

        if self.budget <= 0:
            _warn(f"cni-reaper's own work had no time left of wrapTimeout ({self.settings.wrap_timeout:g} s); "
                  "a later call finishes it")
            return
        previous = signal.signal(signal.SIGALRM, out_of_time)
        start = time.monotonic()
        try:
            signal.setitimer(signal.ITIMER_REAL, self.budget)
            try:
                work()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)  # an alarm due before this line is raised here, and caught
        except Budget:
            self.beside = []
            _warn(f"cni-reaper's own work took longer than wrapTimeout ({self.settings.wrap_timeout:g} s) and was "
                  "stopped; a later call finishes it")
        except BaseException as exc:  # noqa: BLE001 - the wrapped plugin's answer stands, whatever happens here
            self.beside = []
            _warn(f"cni-reaper's own work failed: {type(exc).__name__}: {exc}")
        finally:
            signal.signal(signal.SIGALRM, previous)
            self.budget -= time.monotonic() - start


def _serve(command: str, conf: dict[str, Any], env: dict[str, str], settings: SettingsFile,
           later: list[Callable[[], None]]) -> None:
    import io

    from cni_reaper.cni import shell
    from cni_reaper.verbs.dispatch import dispatch

    if settings.problem:
        _warn(settings.problem)

    def handler(inv: shell.Invocation) -> Any:
        inv.later = later
        inv.conf.wrapped_by = settings  # whoever sweeps this network's records reads its mode from the file
        return dispatch(inv)

    out = io.StringIO()
    shell.run(env, io.BytesIO(jsonio.dumps(conf).encode()), out, handler)
    answer = out.getvalue()
    if answer and '"code"' in answer:  # cni-reaper's own error: logged, the real plugin's answer stands
        _warn(f"cni-reaper's own {command} did not succeed: {answer[:400]}")


def _warn(msg: str) -> None:
    from cni_reaper import log

    log.warn(msg)
