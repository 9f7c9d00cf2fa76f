"""`cni-reaper doctor`: the mistakes that stay silent until something leaks, found before they do.

Each check gives findings (OK / WARN / FAIL, what is wrong, the fix). Nothing here changes anything: files
are read, `stat`ed and listed, tables are listed, and each chained plugin is asked its CNI `VERSION` (what
libcni itself does); the state directory is opened read-only, without its lock.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import asdict, dataclass

from cni_reaper import PLUGIN_NAME
from cni_reaper.cni import versions
from cni_reaper.gojson import pick
from cni_reaper.reap import engine, probes
from cni_reaper.tools.conflists import Network, Scan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.state.record import Record

OK, WARN, FAIL = "OK", "WARN", "FAIL"
VERSION_TIMEOUT = 5.0


@dataclass
class Finding:
    status: str  # OK, WARN or FAIL
    check: str  # which check: a short, stable name
    network: str  # "" for the host
    message: str
    fix: str = ""
    source: str = ""  # the conflist it is about

    def line(self) -> str:
        where = f"{self.network}: " if self.network else ""
        return f"{self.status:<4}  {self.check:<13} {where}{self.message}" + (f" -> fix: {self.fix}" if self.fix else "")

    def as_dict(self) -> dict:
        return asdict(self)


# -- one conflist ------------------------------------------------------------------------------------
def check_order(n: Network) -> Finding:
    types = n.types()
    if n.position == len(types) - 1:
        return Finding(OK, "last-plugin", n.name, f"cni-reaper is the last of {len(types)} plugins", source=n.path)
    after = ", ".join(t or "?" for t in types[n.position + 1:])
    return Finding(FAIL, "last-plugin", n.name,
                   f"cni-reaper is plugin {n.position + 1} of {len(types)}; {after} come after it, so their results "
                   "are not in what it records and it sweeps before they have run",
                   f"move the cni-reaper entry to the end of \"plugins\" in {n.path}", n.path)


def _declares_ports(entry: object) -> bool:
    caps = pick(entry, ("capabilities",)).get("capabilities") if isinstance(entry, dict) else None
    return isinstance(caps, dict) and caps.get("portMappings") is True


def check_capability(n: Network) -> Finding:
    if _declares_ports(n.entry):
        return Finding(OK, "capability", n.name, "cni-reaper declares the portMappings capability", source=n.path)
    mappers = [t for p, t in zip(n.plugins, n.types()) if t != PLUGIN_NAME and _declares_ports(p)]
    if not mappers:
        return Finding(OK, "capability", n.name, "no plugin maps ports, so none are recorded", source=n.path)
    return Finding(FAIL, "capability", n.name,
                   f"{', '.join(mappers)} maps ports but cni-reaper's entry does not declare portMappings: libcni "
                   "does not pass it the ports, so it cannot tell which DNAT rules an allocation owned",
                   f"add \"capabilities\": {{\"portMappings\": true}} to the cni-reaper entry in {n.path}", n.path)


def check_ipam_dir(n: Network, conf) -> Finding:
    dirs = n.host_local_dirs()
    if not dirs:
        return Finding(OK, "ipam-data-dir", n.name, "no host-local IPAM in the chain: ipamDataDir is not used",
                       source=n.path)
    wrong = [d for d in dirs if os.path.normpath(d) != os.path.normpath(conf.ipamDataDir)]
    if not wrong:
        return Finding(OK, "ipam-data-dir", n.name, f"ipamDataDir is host-local's dataDir ({conf.ipamDataDir})",
                       source=n.path)
    return Finding(FAIL, "ipam-data-dir", n.name,
                   f"host-local keeps its reservations in {wrong[0]} but cni-reaper looks in {conf.ipamDataDir}: "
                   "leaked reservations are never released",
                   f"set \"ipamDataDir\": \"{wrong[0]}\" in cni-reaper's entry in {n.path}", n.path)


def find_plugin(name: str, cni_path: list[str]) -> str | None:
    for d in cni_path:
        candidate = os.path.join(d, name)
        if name and "/" not in name and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def plugin_versions(binary: str, version: str) -> list[str] | None:
    """The CNI versions a plugin says it speaks (CNI VERSION, as libcni asks); None when it does not answer."""
    import json

    env = {"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", probes.tools_path())}
    try:
        proc = subprocess.run([binary], input=json.dumps({"cniVersion": version or versions.IMPLICIT}), env=env,
                              capture_output=True, text=True, timeout=VERSION_TIMEOUT, check=False)
        listed = json.loads(proc.stdout).get("supportedVersions")
    except (OSError, subprocess.TimeoutExpired, ValueError, AttributeError):
        return None
    return [v for v in listed if isinstance(v, str)] if isinstance(listed, list) else None


def check_plugins(n: Network, cni_path: list[str]) -> list[Finding]:
    """Every plugin of the chain (and every IPAM plugin) is in the plugin directories and speaks the
    conflist's cniVersion."""
    wanted = _plugin_types(n)
    out = []
    missing = [t for t in dict.fromkeys(wanted) if find_plugin(t, cni_path) is None]
    path_text = ":".join(cni_path)
    if missing:
        out.append(Finding(FAIL, "plugins", n.name,
                           f"not found in {path_text}: {', '.join(t or '(no type)' for t in missing)}; every "
                           "allocation on this network fails",
                           "install them (the reference plugins' release tarball into /opt/cni/bin, or Debian's "
                           "containernetworking-plugins into /usr/lib/cni) or add their directory to Nomad's "
                           "client cni_path (and to --cni-path here)", n.path))
    else:
        out.append(Finding(OK, "plugins", n.name, f"all {len(set(wanted))} plugins found in {path_text}",
                           source=n.path))
    return [*out, _check_versions(n, wanted, cni_path)]


def _plugin_types(n: Network) -> list[str]:
    """The types of the chain's plugins and of their IPAM plugins."""
    wanted = []
    for p, t in zip(n.plugins, n.types()):
        wanted.append(t)
        ipam = pick(p, ("ipam",)).get("ipam") if isinstance(p, dict) else None
        if isinstance(ipam, dict) and isinstance(pick(ipam, ("type",)).get("type"), str):
            wanted.append(pick(ipam, ("type",))["type"])
    return wanted


def _check_versions(n: Network, wanted: list[str], cni_path: list[str]) -> Finding:
    """cni-reaper and every plugin found (that answers VERSION) speak the conflist's cniVersion."""
    version = n.cni_version or versions.IMPLICIT
    if version not in versions.SUPPORTED:
        return Finding(FAIL, "cni-version", n.name, f"cniVersion {n.cni_version!r} is not one cni-reaper speaks "
                       f"({', '.join(versions.SUPPORTED)})",
                       f"set \"cniVersion\" in {n.path} to 1.0.0 (plugins before 1.6) or 1.1.0", n.path)
    refusing = []
    for t in dict.fromkeys(wanted):
        binary = find_plugin(t, cni_path)
        if binary is None:
            continue
        spoken = plugin_versions(binary, version)
        if spoken is not None and version not in spoken:
            refusing.append(f"{t} (speaks up to {spoken[-1] if spoken else 'nothing'})")
    if refusing:
        return Finding(FAIL, "cni-version", n.name,
                       f"cniVersion {version} is not spoken by {', '.join(refusing)}: every allocation fails",
                       "install the conflist's 1.0.0 form (scripts/install.sh picks the form the plugins speak) "
                       "or upgrade the plugins to 1.6 or later", n.path)
    return Finding(OK, "cni-version", n.name, f"cniVersion {version}: spoken by cni-reaper and every plugin "
                   "that answers", source=n.path)


def check_shadowed(n: Network) -> Finding:
    return Finding(WARN, "duplicate", n.name, f"{n.path} is ignored: {n.shadowed_by} comes first and names the same "
                   "network (Nomad and libcni use the first)", "remove or rename one of the two", n.path)


# -- the directories cni-reaper writes ---------------------------------------------------------------
def check_state_dir(network: str, path: str | None) -> Finding:
    from cni_reaper.state.safedir import MODE, problem

    if not path:
        return Finding(FAIL, "state-dir", network, "no usable stateDir", "set stateDir to an absolute path")
    why = problem(path)
    if why:
        return Finding(FAIL, "state-dir", network, f"{why}; cni-reaper refuses it and every ADD fails",
                       f"make {path} a directory of root's (mode 0700), or set stateDir to one")
    if not os.path.exists(path):
        return Finding(OK, "state-dir", network, f"{path} does not exist yet; the first ADD creates it (0700)")
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode != MODE:
        return Finding(WARN, "state-dir", network, f"{path} has mode {mode:04o}; the next call sets it to 0700",
                       f"chmod 0700 {path}")
    return Finding(OK, "state-dir", network, f"{path}: ours, 0700")


def check_own_files(network: str, conf: Any) -> list[Finding]:
    """cni-reaper's own files of a network: its state directory, the room in it, its log file."""
    return [check_state_dir(network, conf.stateDir), check_state_space(network, conf.stateDir),
            check_log_file(network, conf.logFile)]


STATE_ROOM = 1 << 20  # bytes free below which records, the journal and the counters may not be written


def check_state_space(network: str, path: str | None) -> Finding:
    """Room to write in the state directory: without it an ADD passes through unrecorded and a clean-up removes
    nothing it could not journal."""
    if not path or not os.path.isdir(path):
        return Finding(OK, "state-space", network, "no state directory yet")
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Finding(WARN, "state-space", network, f"{path}: {exc.strerror}")
    free = st.f_bavail * st.f_frsize
    if free < STATE_ROOM or (st.f_files and st.f_favail == 0):
        return Finding(FAIL, "state-space", network,
                       f"{path} has {free >> 10} KiB free: ADDs are not recorded and clean-ups remove nothing",
                       f"free space on the file system of {path}")
    return Finding(OK, "state-space", network, f"{path} has {free >> 20} MiB free")


def check_log_file(network: str, path: str) -> Finding:
    if not path:
        return Finding(OK, "log-file", network, "logging to a file is off (logFile \"\"); lines go to the runtime only")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "/"
        if os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK):
            return Finding(OK, "log-file", network, f"{path} will be created on the first line")
        return Finding(WARN, "log-file", network, f"{path} cannot be created ({parent} is missing or not writable): "
                       "what cni-reaper removes is not logged", f"create {parent}, or set logFile")
    except OSError as exc:
        return Finding(WARN, "log-file", network, f"{path}: {exc.strerror}")
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        return Finding(WARN, "log-file", network, f"{path} is a symlink or not a file; cni-reaper does not follow it, "
                       "so nothing is logged", f"replace {path} by a plain file, or set logFile")
    if not os.access(path, os.W_OK):
        return Finding(WARN, "log-file", network, f"{path} is not writable: nothing is logged", f"chmod u+w {path}")
    return Finding(OK, "log-file", network, f"{path} is writable")


def _record_warnings() -> list[tuple[frozenset[str], str, str]]:
    """What doctor says of records in each state that waits on something, worst first: (the states, what is
    wrong, with {n} records, {dir} and {why} the first one's, what to do)."""
    from cni_reaper.judge import DEAD, EXPIRED, HELD, LEFT, UNKNOWN

    return [
        (frozenset({UNKNOWN}), "{n} record(s) in {dir} cannot be judged from here: {why}",
         "run doctor and sweeps where the runtime runs (the host's mount and network namespaces, /proc mounted); "
         "nothing is removed for what cannot be judged"),
        (frozenset({DEAD, EXPIRED}), "{n} dead attachment(s) in {dir} wait for a sweep ({live} live)",
         "the next CNI call on this client cleans them, or now: cni-reaper sweep --apply"),
        (frozenset({HELD}), "{n} dead attachment(s) in {dir} keep a leftover that something not ours holds: {why}",
         "remove what holds it (the foreign rule), then cni-reaper sweep --apply (the next CNI calls look again on "
         "their own, at most hourly)"),
        (frozenset({LEFT}), "{n} dead attachment(s) in {dir} left for the runtime's DEL or GC: {why}",
         "nothing removes them but the runtime's DEL or GC (Nomad: stop the allocation); or remove them by hand "
         "(cni-reaper list shows which)"),
    ]


def check_records(state_dir: str, networks: list[str], states: list[tuple[str, str]]) -> Finding:
    from cni_reaper.judge import LIVE

    label = ", ".join(networks)
    if not os.path.isdir(state_dir):
        return Finding(OK, "dead-records", label, f"no records yet in {state_dir}")
    live = sum(s == LIVE for s, _ in states)
    for which, msg, hint in _record_warnings():
        whys = [why for s, why in states if s in which]
        if whys:
            return Finding(WARN, "dead-records", label, msg.format(n=len(whys), dir=state_dir, why=whys[0], live=live),
                           hint)
    return Finding(OK, "dead-records", label,
                   f"no dead records in {state_dir} ({live} live, {len(states) - live} torn down)")


def check_sharing(state_dir: str, contexts: list, records: list[Record]) -> list[Finding]:
    """Networks that share a state directory with different settings: each record is cleaned with the
    settings recorded with it; a record of cni-reaper 0.2 has none, and waits for its own network's."""
    keys = ("ipamDataDir", "cniCacheDir", "backend")
    seen = {tuple(getattr(c.conf, k) for k in keys) for c in contexts}
    if len(seen) <= 1:
        return []
    legacy = sum(r.settings is None for r in records)
    names = ", ".join(c.network for c in contexts)
    msg = (f"networks {names} share {state_dir} with different ipamDataDir, cniCacheDir or backend: each record "
           "is cleaned with its own network's settings, recorded with it")
    if legacy:
        return [Finding(WARN, "shared-state", names, msg + f"; {legacy} record(s) of cni-reaper 0.2 carry none and are "
                        "cleaned only by their own network's calls or a CLI that reads its conflist",
                        "nothing to do, or give each network its own stateDir")]
    return [Finding(OK, "shared-state", names, msg)]


def check_view(view, confs: list, recorded: int = 0) -> list[Finding]:
    """What this process sees of the host as the runtime does: /proc, the netns directories of the records,
    libcni's cache (whose results directory libcni makes at its first ADD: missing before any record is
    normal), host-local's directories."""
    out = []
    if view.host.problem:
        out.append(Finding(FAIL, "host-view", "", f"{view.host.problem}: no attachment can be judged",
                           "mount /proc (run where the runtime runs)"))
    for why, n in sorted(view.blind.items()):
        out.append(Finding(WARN, "host-view", "", f"{n} attachment(s) cannot be judged here: {why}",
                           "run cni-reaper where the runtime runs: the host's mount and network namespaces"))
    if not out:
        out.append(Finding(OK, "host-view", "", "/proc and every recorded netns directory are seen as the runtime "
                           "sees them"))
    for conf in {c.cniCacheDir: c for c in confs}.values():
        out.append(_check_cache(conf, recorded))
    for conf in confs:
        out += _symlinked_ipam(conf)
    return out


def _check_cache(conf, recorded: int) -> Finding:
    """Whether libcni's cache can be read (missing is normal before any runtime added anything)."""
    problem = probes.cache_problem(conf.cniCacheDir)
    results = probes.cache_results_dir(conf.cniCacheDir)
    fresh = not recorded and not engine.host_local_holds_any(conf.ipamDataDir)  # no runtime has added anything yet
    if problem and fresh and not os.path.exists(results):
        return Finding(OK, "cni-cache", "", f"libcni's cache {results} is not made yet (libcni makes it at the first "
                       "ADD; nothing is recorded or reserved yet)")
    if problem:
        return Finding(WARN, "cni-cache", "", f"{problem}: finished DELs are told only by their netns, and "
                       "`sweep --orphans` proves no attachment dead", "set cniCacheDir to the runtime's libcni "
                       "cache directory (Nomad, containerd, Podman: /var/lib/cni)")
    return Finding(OK, "cni-cache", "", f"libcni's cache {results} is readable")


def _symlinked_ipam(conf) -> list[Finding]:
    network_dir = os.path.join(conf.ipamDataDir, conf.name)
    if os.path.islink(network_dir):
        return [Finding(WARN, "ipam-data-dir", conf.name, f"{network_dir} is a symlink: host-local follows it to reserve "
                        "but its DEL, CHECK and duplicate check walk only real directories (they find nothing), so "
                        "its reservations leak", f"make {network_dir} a directory (a symlinked parent is fine)")]
    if os.path.islink(conf.ipamDataDir.rstrip("/")):
        return [Finding(OK, "ipam-data-dir", conf.name, f"{conf.ipamDataDir} is a symlink to "
                        f"{os.path.realpath(conf.ipamDataDir)}; host-local and cni-reaper follow it")]
    return []


# -- the host ----------------------------------------------------------------------------------------
def check_iptables(backend: str) -> list[Finding]:
    out = []
    found = {}
    for family in (4, 6):
        name, why = probes.iptables_of(backend, family)
        found[family] = name
        if name is None:
            out.append(Finding(WARN if family == 6 else FAIL, "iptables", "", f"ipv{family}: {why}",
                               "install the iptables package (bridge, portmap and firewall need it too)"))
        else:
            out.append(Finding(OK, "iptables", "", f"ipv{family}: {name} ({why})"))
    for family, name in found.items():
        if name is None:
            continue
        other = "legacy" if name == "nft" else "nft"
        stranded = probes.stranded_cni_chains(other, family)
        if stranded:
            command = probes.iptables_tool(family)
            out.append(Finding(WARN, "iptables", "", f"ipv{family}: the {other} tables hold {stranded} CNI chain(s), "
                               f"but {command} is now {name}: the plugins and cni-reaper no longer see them",
                               f"inspect with {command}-{other}-save -t nat; remove what belongs to no "
                               "allocation, or switch back with update-alternatives"))
    return out


def check_nftables() -> Finding:
    present, problem = probes.native_tables()
    if present is None:
        return Finding(OK, "nftables", "", "no nft binary: the plugins cannot make native nftables rules here")
    if problem:
        return Finding(WARN, "nftables", "", f"the nftables tables cannot be listed: {problem}",
                       "run as root; native rules of plugins 1.6+ cannot be cleaned until this works")
    if present:
        return Finding(OK, "nftables", "", f"native tables of plugins 1.6+ present: {', '.join(present)} (cleaned too)")
    return Finding(OK, "nftables", "", "no native tables of plugins 1.6+ (they appear with the nftables backend)")


def check_scan(scan: Scan, dirs: list[str], wrapped: bool = False) -> list[Finding]:
    out = []
    for path, why in scan.unreadable:
        out.append(Finding(WARN, "conflist", "", f"{path} cannot be read: {why}; Nomad cannot load it either",
                           f"fix or remove {path}", path))
    if not scan.networks and wrapped:
        out.append(Finding(OK, "conflist", "", f"no conflist in {', '.join(dirs)} chains cni-reaper; it wraps a plugin "
                           "of Nomad's own bridge network (wrap mode)"))
    elif not scan.networks:
        out.append(Finding(FAIL, "conflist", "", f"no conflist in {', '.join(dirs)} chains cni-reaper",
                           "install one (scripts/install.sh, or /usr/share/cni-reaper/conflist/ from the .deb) or "
                           "point --cni-conf-dir at Nomad's client cni_config_dir"))
    else:
        out.append(Finding(OK, "conflist", "", f"{len(scan.networks)} network(s) chain cni-reaper: "
                           + ", ".join(f"{n.name} ({n.path})" for n in scan.networks)))
    return out


def summary(findings: list[Finding]) -> str:
    counts = {s: sum(f.status == s for f in findings) for s in (OK, WARN, FAIL)}
    return f"{counts[FAIL]} FAIL, {counts[WARN]} WARN, {counts[OK]} OK"


# -- wrap mode -----------------------------------------------------------------------------------------
NOMAD_CONFIG_DIR = "/etc/nomad.d"


def nomad_cni_path(directory: str = NOMAD_CONFIG_DIR) -> tuple[list[str], str] | None:
    """The client's cni_path as the Nomad configuration files in `directory` set it (the last file that sets
    it wins, as Nomad merges them in name order), and that file; None when none does."""
    import glob
    import re

    found = None
    for path in sorted(glob.glob(os.path.join(directory, "*.hcl")) + glob.glob(os.path.join(directory, "*.json"))):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(1 << 20)
        except OSError:
            continue
        m = re.search(r'"?cni_path"?\s*[=:]\s*"([^"]*)"', text)
        if m:
            found = ([d for d in m.group(1).split(":") if d], path)
    return found


def wrappers(cni_path: list[str]) -> list[tuple[str, str]]:
    """(directory, name) of every link to cni-reaper on the path under another plugin's name."""
    from cni_reaper.wrap import real

    own = real.own_identities()
    out = []
    for d in cni_path:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if real.wrapped_name(name) is not None and real._ident(os.path.join(d, name)) in own:
                out.append((d, name))
    return out


def check_wrap(cni_path: list[str], nomad: tuple[list[str], str] | None) -> list[Finding]:
    """Each wrapper: it resolves to cni-reaper, the real plugin of its name follows it on the path (and none
    comes before it), and Nomad's cni_path puts the wrapper's directory first."""
    from cni_reaper.wrap import real

    out = []
    own = real.own_identities()
    for d, name in wrappers(cni_path):
        before = cni_path[:cni_path.index(d)]
        shadow = real.find(name, before, own)
        after = real.find(name, cni_path[cni_path.index(d) + 1:], own)
        if shadow:
            out.append(Finding(FAIL, "wrap", "", f"{shadow} comes before the wrapper {d}/{name} on the path: the "
                               "runtime runs it and the wrapper never", f"put {d} first in cni_path"))
        elif after is None:
            out.append(Finding(FAIL, "wrap", "", f"the wrapper {d}/{name} finds no real {name} after it on the path: "
                               "every allocation on the network fails", f"install the reference plugins, or add their "
                               f"directory after {d} in cni_path"))
        else:
            out.append(Finding(OK, "wrap", "", f"{d}/{name} wraps {after}"))
        if nomad is not None and nomad[0][:1] != [d]:
            out.append(Finding(WARN if d in nomad[0] else FAIL, "wrap", "", f"Nomad's cni_path in {nomad[1]} is "
                               f"{':'.join(nomad[0])}: the wrapper directory {d} is not first",
                               f'set cni_path = "{d}:{":".join(x for x in nomad[0] if x != d)}" in the client block'))
    return out


def check_settings_file(path: str) -> list[Finding]:
    """The settings file of wrapped networks, checked whole against its model (models.SettingsFile): every key
    whose value a wrapped call cannot use (it then takes the default, or observes), with where it is. None when
    there is no such file."""
    from cni_reaper.cni.settings_file import document

    doc, problem = document(path)
    if problem:
        return [Finding(FAIL, "settings-file", "", problem, f"make {path} one JSON object, each key once, that root "
                        "owns and alone may write, or remove it", path)]
    if doc is None:
        return []
    from pydantic import ValidationError  # only with a settings file to check: doctor's start is not the timer's

    from cni_reaper.models import SettingsFile

    try:
        SettingsFile.model_validate(doc)
    except ValidationError as exc:
        said = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors())
        return [Finding(WARN, "settings-file", "", f"{path}: keys a wrapped call cannot use (it takes the default, "
                        f"and an unusable mode observes): {said}", "correct them (README, \"The settings file\")", path)]
    return [Finding(OK, "settings-file", "", f"{path}: every key is usable", source=path)]


def check_mode(network: str, mode: str, source: str | None) -> Finding:
    if mode == "observe":
        return Finding(WARN, "mode", network, "observe mode: dead attachments are judged and logged (\"would remove\"), "
                       "nothing is removed", f'set "mode": "clean" in {source or "the settings"} once the log shows only '
                       "what should go", source or "")
    return Finding(OK, "mode", network, "clean mode: dead attachments' leftovers are removed", source=source or "")


def check_nomad(args) -> list[Finding]:
    """doctor's look at the connection to Nomad, when one is configured: reachable (TLS and all), the
    token's rights, the agent this host's client."""
    from cni_reaper.reap.engine import nomad_connection

    asked = nomad_connection(args)
    if asked is None:
        return []
    word, address = asked
    if word.problems:
        return [Finding(FAIL, "nomad", "", "; ".join(word.problems),
                        f"set NOMAD_ADDR, the TLS settings and a token with {probes.nomad_rights()} (README, "
                        "\"The scheduler's word\"); until then sweep --nomad removes nothing on Nomad's word")]
    return [Finding(OK, "nomad", "", f"{address} is this host's Nomad client (node {word.node}) and the token may "
                    "list its allocations: sweep --nomad also removes what allocations Nomad says are over leave "
                    "behind")]
