"""The CNI protocol shell: environment, stdin, version negotiation, dispatch, result or error JSON on stdout.

Modelled on libcni's skel: everything a runtime can get wrong is refused here, before any command runs,
with the spec's error code; the commands only ever see a validated Invocation.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import IO, Any, Callable

from cni_reaper import PLUGIN_NAME, __version__, jsonio, log
from cni_reaper.cni import names, versions
from cni_reaper.cni.conf import TOP_FIELDS, TOP_RESETTABLE
from cni_reaper.errors import (
    DECODE_FAILURE,
    INCOMPATIBLE_VERSION,
    INTERNAL,
    INVALID_ENV,
    CniError,
)
from cni_reaper.gojson import pick

MAX_STDIN_BYTES = 16 << 20
VERBS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
# Which env variables each verb needs (as skel does; DEL may come without a netns).
REQUIRED_ENV = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": ("CNI_PATH",),
    "STATUS": ("CNI_PATH",),
}
MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


def about() -> str:
    return f"CNI {PLUGIN_NAME} plugin v{__version__}: reaps the rules and reservations of dead attachments"


class Invocation:
    """One validated CNI call (a plain class: `dataclasses` alone costs milliseconds to import)."""

    def __init__(self, command: str, version: str, conf: Any, raw: dict[str, Any]) -> None:
        self.command = command
        self.version = version
        self.conf = conf  # conf.Conf
        self.raw = raw
        self.container_id = ""
        self.netns = ""
        self.ifname = ""
        self.args: dict[str, str] = {}
        # work a verb may leave for its caller to run later, while something else runs beside it (the wrapper:
        # while the real plugin runs); None: a verb does all of its work before it returns
        self.later: list[Callable[[], None]] | None = None


def parse_cni_args(value: str) -> dict[str, str]:
    """CNI_ARGS is `K=V;K2=V2`. Malformed pairs are skipped, not fatal: the runtime owns this variable."""
    out: dict[str, str] = {}
    for pair in value.split(";")[:64]:
        key, sep, val = pair.partition("=")
        if sep and key and len(key) <= 256 and len(val) <= 4096:
            out[key] = val
    return out


def _read_config(stdin: IO[bytes]) -> dict[str, Any]:
    data = stdin.read(MAX_STDIN_BYTES + 1)
    if len(data) > MAX_STDIN_BYTES:
        raise CniError(DECODE_FAILURE, "network configuration on stdin is too large", f"limit is {MAX_STDIN_BYTES} bytes")
    if not data.strip():
        raise CniError(DECODE_FAILURE, "no network configuration on stdin",
                       "the runtime must pass the plugin's config as JSON on stdin")
    try:
        conf = jsonio.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CniError(DECODE_FAILURE, "network configuration is not valid JSON", str(exc)[:300]) from None
    if not isinstance(conf, dict):
        raise CniError(DECODE_FAILURE, "network configuration must be a JSON object", f"got {type(conf).__name__}")
    return conf


def _parse_conf(raw: dict[str, Any], top: dict[str, Any], command: str):
    from cni_reaper.cni.conf import parse

    return parse(raw, top, lenient=command == "DEL")


def build_invocation(env: Mapping[str, str], stdin: IO[bytes], seen: dict[str, Any] | None = None) -> Invocation:
    raw = _read_config(stdin)
    top = pick(raw, TOP_FIELDS, TOP_RESETTABLE)
    if seen is not None:
        seen.update(top=top)
    command = env.get("CNI_COMMAND", "")
    if command not in VERBS:
        raise CniError(INVALID_ENV, f"unknown CNI_COMMAND: {command[:32]!r}", f"expected one of {', '.join(VERBS)}")
    missing = [k for k in REQUIRED_ENV[command] if not env.get(k)]
    if missing:
        # skel reports a missing container ID with its own code; keep that
        if missing[0] == "CNI_CONTAINERID":
            names.container_id("")
        raise CniError(INVALID_ENV, f"required environment variables missing: {', '.join(missing)}",
                       "a CNI runtime sets these; when calling by hand, set them all")
    version = versions.negotiate(top.get("cniVersion"), top.get("cniVersions"))
    minimum = MIN_VERSION.get(command)
    if minimum and not versions.at_least(version, minimum):
        raise CniError(INCOMPATIBLE_VERSION, f"config version does not allow {command}",
                       f"{command} needs cniVersion {minimum} or later; the config says {version}")
    names.network_name(top.get("name"))
    inv = Invocation(command=command, version=version, conf=None, raw=raw)
    if command in ("ADD", "DEL", "CHECK"):
        inv.container_id = names.container_id(env.get("CNI_CONTAINERID"))
        inv.ifname = names.ifname(env.get("CNI_IFNAME"))
        inv.netns = env.get("CNI_NETNS", "")
        if "\0" in inv.netns or len(inv.netns) > 4096:
            raise CniError(INVALID_ENV, "invalid CNI_NETNS", "expected a path to a network namespace")
        inv.args = parse_cni_args(env.get("CNI_ARGS", ""))
    inv.conf = _parse_conf(raw, top, command)
    return inv


def _error_version(top: dict[str, Any] | None) -> str:
    wanted = (top or {}).get("cniVersion")
    if isinstance(wanted, str) and wanted in versions.SUPPORTED:
        return wanted
    return versions.LATEST


def run(env: Mapping[str, str], stdin: IO[bytes], stdout: IO[str], handler: Callable[[Invocation], Any]) -> int:
    """Serve one CNI invocation: `handler` (the verbs' dispatcher, as skel takes its commands) gets the
    validated Invocation and returns the result document or None. Returns the exit status; writes exactly
    one JSON document on stdout."""
    command = env.get("CNI_COMMAND", "")
    if command == "VERSION":
        stdout.write(jsonio.dumps({"cniVersion": versions.LATEST, "supportedVersions": list(versions.SUPPORTED)}))
        return 0
    seen: dict[str, Any] = {}
    try:
        inv = build_invocation(env, stdin, seen)
        log.begin(inv.conf.logFile, verb=inv.command, network=inv.conf.name, containerID=inv.container_id)
        for warning in inv.conf.warnings:
            log.warn("configuration not usable as given; carrying on", problem=warning)
        result = handler(inv)
        if result is not None:
            stdout.write(jsonio.dumps(result))
        return 0
    except CniError as err:
        stdout.write(jsonio.dumps(err.to_json(_error_version(seen.get("top")))))
        return 1
    except Exception as exc:  # noqa: BLE001 - a runtime must get error JSON, never a traceback
        log.event("error", "internal error", error=f"{type(exc).__name__}: {exc}")
        internal = CniError(INTERNAL, f"internal error in cni-reaper: {type(exc).__name__}: {exc}"[:500],
                            "please report this with the plugin's stderr output")
        stdout.write(jsonio.dumps(internal.to_json(versions.LATEST)))
        return 1


def main_cni(env: Mapping[str, str], handler: Callable[[Invocation], Any]) -> int:
    """One CNI call on this process's stdin and stdout; a closed stdin reads as empty, a closed stdout fails
    the call (exit 1) after its work, never with a traceback."""
    if sys.stdin is None or sys.stdout is None:
        import io

        stdin = sys.stdin.buffer if sys.stdin is not None else io.BytesIO()
        code = run(env, stdin, sys.stdout or io.StringIO(), handler)
        return code if sys.stdout is not None else (code or 1)
    try:
        code = run(env, sys.stdin.buffer, sys.stdout, handler)
        sys.stdout.flush()
    except (OSError, ValueError):
        code = 1
    return code
