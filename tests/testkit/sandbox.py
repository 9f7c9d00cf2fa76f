"""Throwaway CNI hosts for tests: a network namespace that plays the Nomad client's host, with its own
/var/lib/cni, its own iptables flavour on PATH and its own plugin directory.

Everything netfilter happens inside namespaces made here and deleted on close: the reference plugins and
cni-reaper run under `ip netns exec <host>`, which also gives them a private mount namespace in which the
sandbox's directory is bind-mounted over /var/lib/cni (libcni's result cache, host-local's reservations,
cni-reaper's default state dir). The machine's own tables and /var/lib/cni are never touched.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REFERENCE_PLUGINS = Path("/usr/lib/cni")
CONFLISTS = REPO / "conflist"
_counter = itertools.count()


# Mount points the sandboxes need where the machine has none (/run/cni): made once, shared by every process
# that runs sandboxes at the same time (the suite and the property test run side by side, and tests start
# Python processes of their own), and removed by the last one. Each user holds a shared flock on /run
# itself (no lock file left behind) from its first mount point to its exit; the one that can turn it into an
# exclusive lock at exit is the last, and removes what MADE lists (what the tests made, not the machine's).
MADE = "/run/cni-reaper-tests.made"
_users_fd: list[int] = []


def mountpoint(path: str) -> None:
    """An empty directory for the sandboxes' private mounts, where the machine has none (removed by the last
    process using it)."""
    import atexit
    import fcntl

    if not _users_fd:
        fd = os.open("/run", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while the last user of a previous run removes its mount points
        _users_fd.append(fd)
        atexit.register(_remove_made)
    if os.path.isdir(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:  # another process made it just now
        return
    with open(MADE, "a") as f:
        f.write(path + "\n")


def _remove_made() -> None:
    import fcntl

    fd = _users_fd.pop()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # others still use them: the last one removes them
        os.close(fd)
        return
    try:
        with open(MADE) as f:
            made = [p for p in f.read().splitlines() if p]
        for p in reversed(made):
            if os.path.isdir(p) and not os.listdir(p):
                os.rmdir(p)
        os.unlink(MADE)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, text=True, capture_output=True, **kw)


def unique(prefix: str) -> str:
    return f"{prefix}{os.getpid() % 100000}-{next(_counter)}"


def ips_of(proc) -> list[str]:
    """The addresses (without prefix) of a successful ADD through the driver; a failed ADD fails the test."""
    assert proc.returncode == 0, proc.stderr
    return [ip["address"].split("/")[0] for ip in json.loads(proc.stdout)[-1]["ips"]]


def binary_exe() -> str:
    """The built bundle (scripts/build.sh or release.sh), or CNI_REAPER_BIN; skips the calling test when there
    is none, except in CI (CI set), where a missing bundle is a failure."""
    import pytest

    exe = os.environ.get("CNI_REAPER_BIN") or str(REPO / "dist" / "cni-reaper" / "cni-reaper")
    if not os.access(exe, os.X_OK):
        why = f"no built binary at {exe} (scripts/build.sh); set CNI_REAPER_BIN to test one"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return exe


def needs_root() -> None:
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")


def build_driver(runtime: str = "go-cni-1.1.7") -> str:
    """Build the go-cni driver (tests/driver) offline, in GOPATH mode, once per source version and runtime:
    go-cni 1.1.7 over libcni 1.1.2 with Debian 12's Go, or go-cni 1.1.13 over libcni 1.3 with Go 1.27 from
    Debian unstable (fetched into the test cache, see debian_sid)."""
    srcs = sorted((REPO / "tests" / "driver").glob("*.go"))
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in srcs)).hexdigest()[:12]
    cache = Path(os.environ.get("CNI_REAPER_CACHE", "/tmp/cni-reaper-test-cache"))
    out = cache / f"reaperdriver-{runtime}-{digest}"
    if out.exists():
        return str(out)
    gopath = cache / f"gopath-{runtime}"
    pkg = gopath / "src" / "reaperdriver"
    pkg.mkdir(parents=True, exist_ok=True)
    for old in pkg.glob("*.go"):
        old.unlink()
    for src in srcs:
        shutil.copy(src, pkg / src.name)
    env = dict(os.environ, GO111MODULE="off", GOCACHE=str(cache / f"gocache-{runtime}"), GOFLAGS="",
               GOPROXY="off", GOTOOLCHAIN="local")
    if runtime == "go-cni-1.1.7":
        if not shutil.which("go"):
            raise RuntimeError("go is not installed: run scripts/setup.sh (golang-go, golang-github-containerd-go-cni-dev)")
        go, tags = "go", []
        env["GOPATH"] = f"{gopath}:/usr/share/gocode"
    elif runtime == "go-cni-1.1.13":
        from . import debian_sid

        try:
            sid = debian_sid.root("runtime")
        except debian_sid.FetchError as exc:
            raise RuntimeError(f"cannot fetch the Nomad 1.9.5+ runtime (go-cni 1.1.13, libcni 1.3, Go 1.27): {exc}") from None
        goroot = sid / "usr" / "lib" / "go-1.27"
        go, tags = str(goroot / "bin" / "go"), ["-tags", "libcni13"]
        env.update(GOROOT=str(goroot), GOPATH=f"{gopath}:{sid / 'usr' / 'share' / 'gocode'}", CGO_ENABLED="0")
    else:
        raise ValueError(runtime)
    tmp = out.with_suffix(f".{os.getpid()}")
    proc = subprocess.run([go, "build", *tags, "-o", str(tmp), "."], cwd=pkg, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the go-cni driver ({runtime}) failed:\n{proc.stderr}")
    tmp.rename(out)
    return str(out)


PLUGIN_SETS = ("1.1.1", "1.9")  # Debian 12's reference plugins; Debian unstable's, as Nomad users run today


def reference_plugins(which: str = "1.1.1") -> Path:
    """The reference plugins' directory: Debian 12's, or 1.9.x fetched from Debian unstable."""
    if which == "1.1.1":
        return REFERENCE_PLUGINS
    from . import debian_sid

    try:
        return debian_sid.plugins_dir()
    except debian_sid.FetchError as exc:
        raise RuntimeError(f"cannot fetch the reference plugins 1.9.x from Debian unstable: {exc}") from None


class Stack:
    """What one Nomad client runs: which reference plugins, which runtime library, which conflist form.

    The runtime go-cni 1.1.13 (Nomad 1.9.5+) calls Status() before every Setup and Teardown; with plugins
    that speak CNI 1.1.0 (1.6+) the shipped 1.1.0 conflists are used, so that STATUS really reaches the
    plugins, as `scripts/install.sh` would install them; otherwise the 1.0.0 forms."""

    def __init__(self, plugins: str = "1.1.1", runtime: str = "go-cni-1.1.7") -> None:
        self.plugins, self.runtime = plugins, runtime
        self.status = runtime == "go-cni-1.1.13"
        self.cni_version = "1.1.0" if plugins != "1.1.1" and runtime == "go-cni-1.1.13" else "1.0.0"

    @property
    def id(self) -> str:
        return f"plugins-{self.plugins}+{self.runtime}"

    def shipped(self, name: str = "nomad-reaper.conflist") -> Path:
        return CONFLISTS / name if self.cni_version == "1.0.0" else CONFLISTS / "1.1.0" / name


DEBIAN12 = Stack("1.1.1", "go-cni-1.1.7")
STACKS = (DEBIAN12, Stack("1.9", "go-cni-1.1.7"), Stack("1.9", "go-cni-1.1.13"), Stack("1.1.1", "go-cni-1.1.13"))
FLAVOUR_OF = {"nft": ("nft", "nft"), "legacy": ("legacy", "legacy"), "mixed": ("legacy", "nft")}  # (IPv4, IPv6)


def flavour_bin_dir(root: Path, flavour: str) -> Path:
    """A directory whose iptables* names point at one flavour's multi binary, first on PATH. "mixed" is a
    host whose `iptables` alternative is legacy and whose `ip6tables` is still nft."""
    d = root / f"bin-{flavour}"
    d.mkdir(exist_ok=True)
    for family, tool in ((4, "iptables"), (6, "ip6tables")):
        fl = FLAVOUR_OF[flavour][0 if family == 4 else 1]
        multi = shutil.which(f"xtables-{fl}-multi") or f"/usr/sbin/xtables-{fl}-multi"
        for name in (tool, f"{tool}-save", f"{tool}-restore"):
            link = d / name
            if not link.exists():
                link.symlink_to(multi)
    return d


class Sandbox:
    def __init__(self, root: Path, flavour: str, reaper: str, driver: str | None = None, stack: Stack = DEBIAN12) -> None:
        self.root = root
        self.flavour = flavour
        self.stack = stack
        self.driver_bin = driver
        self.plugins = reference_plugins(stack.plugins)
        self.cni_dir = root / "var-lib-cni"  # mounted over /var/lib/cni inside the sandbox
        self.cni_dir.mkdir(parents=True, exist_ok=True)
        self.var_log = root / "var-log"  # and over /var/log: a shipped conflist's logFile lands here
        self.var_log.mkdir(exist_ok=True)
        self.run_cni = root / "var-run-cni"  # and over /var/run/cni: Nomad 1.9.4+'s bridge network keeps host-local there
        self.run_cni.mkdir(exist_ok=True)
        mountpoint("/run/cni")
        self.log_file = root / "cni-reaper.log"
        self.plugin_dir = root / "plugins"
        self.plugin_dir.mkdir(exist_ok=True)
        (self.plugin_dir / "cni-reaper").symlink_to(reaper)
        self.bin_dir = flavour_bin_dir(root, flavour)
        self.host = unique("crt-h")
        self.containers: list[str] = []
        # the boot id the sandbox's processes read, mounted over /proc's (as systemd-nspawn gives a container its
        # own): a new one after reboot(); a process that unmounts it reads the machine's, in another view
        self.boot_file = root / "boot-id-0"
        self.boot_file.write_text(f"{uuid.uuid4()}\n")
        self.extra_env: dict[str, str] = {}  # for every process run in the sandbox (e.g. CNI_REAPER_CONFIG)
        self.plugin_path = ""  # the runtime's plugin directories, when not the sandbox's own then the reference plugins
        os.makedirs("/var/lib/cni", exist_ok=True)  # the mount point; empty on a fresh machine
        sh("ip", "netns", "add", self.host)
        self.run(["ip", "link", "set", "lo", "up"])
        self.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        try:
            self.settle(timeout=30)  # no child of cni-reaper's left reading tables of namespaces being removed
        except (AssertionError, OSError):
            pass
        for name in self.containers + [self.host]:
            sh("ip", "netns", "del", name, check=False)
        self.containers.clear()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def container(self) -> str:
        """A new container netns; returns its path (what Nomad passes as CNI_NETNS)."""
        name = unique("crt-c")
        sh("ip", "netns", "add", name)
        self.containers.append(name)
        return f"/var/run/netns/{name}"

    def remove_container(self, path: str) -> None:
        """Delete the container netns as a runtime does, and return once the kernel has torn down what was in
        it: the host ends of its veths go in the kernel's netns clean-up work, some time after the last
        reference is dropped (under load, seconds later), and until then the attachment is rightly seen live."""
        name = os.path.basename(path)
        peers = self._veth_peers(name)
        sh("ip", "netns", "del", name, check=False)
        if name in self.containers:
            self.containers.remove(name)
        deadline = time.monotonic() + 60
        while peers and time.monotonic() < deadline:
            links = sh("ip", "-n", self.host, "-j", "link", "show", check=False).stdout
            present = {link.get("ifindex") for link in json.loads(links or "[]")}
            if not peers & present:
                return
            time.sleep(0.02)
        assert not peers, f"the host ends {sorted(peers)} of {name}'s veths outlived it by 60 s"

    def _veth_peers(self, name: str) -> set[int]:
        """ifindexes, in the sandbox's host netns, of the peers of the veths in netns `name`."""
        out = sh("ip", "-n", name, "-j", "link", "show", check=False).stdout
        return {link["link_index"] for link in json.loads(out or "[]")
                if "link_index" in link and "link_netnsid" in link}

    # -- running things inside -------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
        env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        env.update(self.extra_env)
        env.update(extra or {})
        return env

    def wrap(self, argv: list[str], pre: str = "") -> list[str]:
        """argv run inside the host netns, in a private mount namespace with the sandbox's /var/lib/cni and
        /var/log, and its own boot id (and `pre`, shell commands run first in that namespace,
        e.g. to hide a binary)."""
        boot = f'mount --bind "{self.boot_file}" /proc/sys/kernel/random/boot_id && '
        return ["ip", "netns", "exec", self.host, "sh", "-c",
                f'mount --bind "$0" /var/lib/cni && mount --bind "$1" /var/log && mount --bind "$2" /run/cni && '
                f'shift 2 && {boot}{pre + " && " if pre else ""}exec "$@"', str(self.cni_dir), str(self.var_log),
                str(self.run_cni), *argv]

    def run(self, argv: list[str], env: dict[str, str] | None = None, input: str | None = None,
            check: bool = False, timeout: float = 120, pre: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(self.wrap(argv, pre), env=self.env(env), input=input, text=True, capture_output=True,
                              check=check, timeout=timeout)

    def popen(self, argv: list[str], env: dict[str, str] | None = None, quiet: bool = False) -> subprocess.Popen:
        """Started, not waited for. With quiet, output goes to /dev/null (nothing can block on a full pipe)."""
        out = subprocess.DEVNULL if quiet else subprocess.PIPE
        return subprocess.Popen(self.wrap(argv), env=self.env(env), stdin=subprocess.PIPE, stdout=out, stderr=out,
                                text=True)

    def shipped(self, name: str = "nomad-reaper.conflist") -> Path:
        """A shipped conflist, in the form this sandbox's stack would install."""
        return self.stack.shipped(name)

    def conflist(self, path: Path | None = None, without_reaper: bool = False, name: str | None = None,
                 bridge: str | None = None, subnet: str | None = None, **reaper_conf) -> Path:
        """The shipped conflist (or another), with extra keys for cni-reaper; written into the sandbox.
        `without_reaper` gives the reference chain alone (how leaks from before installation are made)."""
        data = json.loads(Path(path or self.shipped()).read_text())
        if name:
            data["name"] = name
        if without_reaper:
            data["plugins"] = [p for p in data["plugins"] if p["type"] != "cni-reaper"]
        reaper_conf.setdefault("logFile", str(self.log_file))
        for plugin in data["plugins"]:
            if plugin["type"] == "cni-reaper":
                plugin.update(reaper_conf)
            if plugin["type"] == "bridge" and bridge:
                plugin["bridge"] = bridge
            if plugin["type"] == "bridge" and subnet:
                plugin["ipam"]["ranges"] = [[{"subnet": subnet}]]
        out = self.root / f"{data['name']}{'-plain' if without_reaper else ''}.conflist"
        tmp = out.with_suffix(f".{os.getpid()}.{next(_counter)}")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.rename(out)  # atomic: parallel drivers may be reading it
        return out

    def driver(self, op: str, cid: str = "", netns: str = "", ports: tuple[str, ...] = (), conflist: Path | None = None,
               args: tuple[str, ...] = (), ports_shape: str = "omit", valid: tuple[str, ...] = (),
               settle: bool = True, status: bool = True) -> subprocess.CompletedProcess:
        """One operation through the stack's runtime, called as Nomad calls it (Status() first on 1.9.5+; `status`
        False: not, as Nomad sends CHECK); then, unless `settle` is false, the wait for what cni-reaper left for
        after its answer (`settle`)."""
        assert self.driver_bin, "this sandbox has no go-cni driver"
        argv = [self.driver_bin, "-conflist", str(conflist or self.conflist()), "-plugindir",
                self.plugin_path or f"{self.plugin_dir}:{self.plugins}", "-op", op, "-id", cid, "-netns", netns,
                "-ports", ports_shape]
        if self.stack.status and status:
            argv.append("-status")
        for p in ports:
            argv += ["-port", p]
        for v in valid:
            argv += ["-valid", v]
        for a in args:
            argv += ["-arg", a]
        proc = self.run(argv)
        if settle:
            self.settle()
        return proc

    def settle(self, state_dir: Path | None = None, timeout: float = 60) -> None:
        """Wait until the work cni-reaper's calls left for after their answers is done (cni/afterwards.py: an
        ADD's look at who else maps its host ports): its children hold a shared flock until they are."""
        lock = (state_dir or self.state_dir()) / ".afterwards.lock"
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO there: no wait
        except OSError:  # none there, or no directory to hold one (a test's damaged state dir): no work to wait for
            return
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    return
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"cni-reaper's work after its answer still runs after {timeout} s"
                    time.sleep(0.005)
        finally:
            os.close(fd)

    def plugin(self, command: str, conf: dict | str | bytes, cid: str = "", netns: str = "", ifname: str = "eth0",
               env: dict[str, str] | None = None, pre: str = "") -> tuple[int, dict | None, str]:
        """Invoke cni-reaper directly as a runtime would. Returns (exit status, stdout JSON or None, stderr)."""
        cni_env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
                   "CNI_PATH": f"{self.plugin_dir}:{self.plugins}"}
        cni_env.update(env or {})
        cni_env = {k: v for k, v in cni_env.items() if v is not None}
        stdin = conf if isinstance(conf, str) else json.dumps(conf)
        proc = self.run([str(self.plugin_dir / "cni-reaper")], env=cni_env, input=stdin, pre=pre)
        if isinstance(conf, dict) and conf.get("stateDir"):
            self.settle(Path(conf["stateDir"]))
        self.settle()
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
        return proc.returncode, out, proc.stderr

    def save(self, family: int = 4, table: str | None = None) -> str:
        tool = "iptables-save" if family == 4 else "ip6tables-save"
        argv = [str(self.bin_dir / tool)] + (["-t", table] if table else [])
        return self.run(argv, check=True).stdout

    def status_conf(self, **extra) -> dict:
        """A STATUS config for cni-reaper with the sandbox's defaults (the cheapest verb that sweeps)."""
        return {"cniVersion": "1.1.0", "name": "nomad-reaper", "type": "cni-reaper", "logFile": str(self.log_file), **extra}

    def status(self, pre: str = "", env: dict[str, str] | None = None, **extra) -> tuple[int, dict | None, str]:
        return self.plugin("STATUS", self.status_conf(**extra), cid="", netns="", ifname="", pre=pre, env=env)

    def tables(self) -> str:
        """nat and filter of both families, counters dropped: what 'byte-identical' is judged on."""
        import re

        four = " && ".join(f'"{self.bin_dir / tool}" -t {t}' for tool in ("iptables-save", "ip6tables-save")
                           for t in ("nat", "filter"))
        text = self.run(["sh", "-c", four], check=True).stdout  # one process in the sandbox, not four
        return "\n".join(re.sub(r" \[\d+:\d+\]$", "", l) for l in text.splitlines() if not l.startswith("#"))

    def normalized_tables(self) -> list[str]:
        """tables(), its chains sorted (iptables-nft lists a chain made again after the others) and every rule
        in its chain's order: what undo is judged on."""
        out: list[str] = []
        for block in self.tables().split("COMMIT"):
            lines = block.splitlines()
            out += sorted(line for line in lines if line.startswith((":", "*")))
            rules: dict[str, list[str]] = {}
            for line in lines:
                if line.startswith("-A "):
                    rules.setdefault(line.split()[1], []).append(line)
            out += [line for chain in sorted(rules) for line in rules[chain]]
        return out

    def snapshot(self, network: str, cid: str, ips: list[str]) -> tuple[list[str], dict[str, tuple]]:
        """An attachment's lines in every table (iptables and native) and its reservations, with their inodes
        and contents: what 'byte-identical' is judged on."""
        lines = self.residue(network, cid, ips) + [l for l in self.native_rules()
                                                   if cid in l or any(f"{ip} " in l for ip in ips)]
        found = {}
        for d in self.cni_dir.glob(f"*/{network}"):
            for p in d.iterdir():
                if p.name in ips:
                    found[str(p)] = (p.stat().st_ino, p.read_bytes())
        return sorted(lines), found

    def reservations(self, network: str) -> dict[str, str]:
        """host-local's reservations of `network` (IP -> container ID), in whichever dataDir under the
        sandbox's /var/lib/cni the conflist names (networks/ by default, services/ in custom-network)."""
        out = {}
        for d in sorted([*self.cni_dir.glob(f"*/{network}"), self.run_cni / network]):
            if d.is_dir() and d.parent.name not in ("results", "reaper"):
                out.update({p.name: p.read_text().split()[0] for p in d.iterdir() if p.name[0].isdigit() or ":" in p.name})
        return out

    def residue(self, network: str, cid: str, ips: list[str], tables: str | None = None) -> list[str]:
        """Everything of (network, cid) in the tables and host-local: chains, tagged rules, firewall rules of
        its IPs, reservations naming it. Pass `tables` (from tables()) to check many attachments at once."""
        import hashlib

        digest = hashlib.sha512((network + cid).encode()).hexdigest()
        names = {("CNI-" + digest)[:28], ("CNI-DN-" + digest)[:28], ("CNI-SN-" + digest)[:28]}
        out = []
        for line in (self.tables() if tables is None else tables).splitlines():
            if any(n in line for n in names) or f'id: \"{cid}\"' in line or (line.startswith("-A CNI-FORWARD") and any(f" {ip}/" in line for ip in ips)):
                out.append(line)
        out += [f"reservation {ip}" for ip, owner in self.reservations(network).items() if owner == cid]
        return out

    def reboot(self, tmpfs_dirs: tuple[str, ...] = ()) -> None:
        """A host reboot with restored rules (Nomad #18842): every namespace is gone, the saved rules are put
        back into a fresh host netns, the sandbox's processes read a new boot id, /var/lib/cni (records,
        reservations) survives but for `tmpfs_dirs` (paths under it that are emptied, as a tmpfs is: Nomad
        1.9.4+ keeps host-local's reservations in /var/run/cni)."""
        saved = {f: self.save(f) for f in (4, 6)}
        self.boot_file = self.root / f"boot-id-{next(_counter)}"
        self.boot_file.write_text(f"{uuid.uuid4()}\n")
        for rel in tmpfs_dirs:
            d = self.run_cni if rel == "/var/run/cni" else self.cni_dir / rel
            if d.exists():
                shutil.rmtree(d)
            if d == self.run_cni:
                d.mkdir()
        for name in self.containers + [self.host]:
            sh("ip", "netns", "del", name, check=False)
        self.containers.clear()
        self.host = unique("crt-h")
        sh("ip", "netns", "add", self.host)
        self.run(["ip", "link", "set", "lo", "up"])
        self.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        for family, text in saved.items():
            tool = "iptables-restore" if family == 4 else "ip6tables-restore"
            self.run([str(self.bin_dir / tool)], input=text, check=True)

    def serve(self, netns: str, port: int, reply: str) -> subprocess.Popen:
        """A one-connection TCP server in a container netns that answers `reply`."""
        code = ("import socket,sys;s=socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET);"
                "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind((sys.argv[1],int(sys.argv[2])));"
                "s.listen(1);s.settimeout(20);c,_=s.accept();c.sendall(sys.argv[3].encode());c.close()")
        proc = subprocess.Popen(["ip", "netns", "exec", os.path.basename(netns), sys.executable, "-c", code,
                                 "0.0.0.0", str(port), reply], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return proc

    def leaked(self, conflist, ports: tuple[str, ...] = ()) -> tuple[str, list[str]]:
        """(container ID, addresses) of an allocation added through `conflist` (the runtime's driver) whose
        namespace then vanished with no DEL: dead, its leftovers in place."""
        cid, netns = unique("alloc-"), self.container()
        out = self.driver("add", cid, netns, ports, conflist)
        assert out.returncode == 0, out.stdout + out.stderr
        ips = ips_of(out)
        self.remove_container(netns)
        return cid, ips

    def reach(self, netns: str, host_ip: str, host_port: int, reply: str, served: int = 80) -> str:
        """Serve `reply` on port `served` in a container netns and connect to host_ip:host_port from the host
        netns, retrying while refused (up to 10 s): what answered, or 'timeout'/'refused ...'."""
        server = self.serve(netns, served, reply)
        try:
            deadline, answer = time.monotonic() + 10, ""
            while time.monotonic() < deadline:
                answer = self.connect(host_ip, host_port)
                if not answer.startswith("refused"):
                    break
                time.sleep(0.2)
            return answer
        finally:
            server.kill()
            server.wait()

    def connect(self, ip: str, port: int, timeout: float = 3.0) -> str:
        """Connect from the host netns; returns what the server said, or 'timeout'/'refused'."""
        code = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=float(sys.argv[3]))\n"
                " print(s.recv(100).decode())\nexcept socket.timeout:\n print('timeout')\nexcept OSError as e:\n print('refused', e)")
        return self.run([sys.executable, "-c", code, ip, str(port), str(timeout)]).stdout.strip()

    # -- native nftables, a client outside, UDP streams ---------------------------------------------
    def native_conflist(self, name: str = "nomad-reaper.conflist", without_reaper: bool = False, **reaper_conf) -> Path:
        """A shipped conflist with the plugins' native nftables backends (bridge `ipMasqBackend`, portmap
        `backend`; plugins 1.6+)."""
        data = json.loads(self.shipped(name).read_text())
        for plugin in data["plugins"]:
            if plugin["type"] == "bridge":
                plugin["ipMasqBackend"] = "nftables"
            if plugin["type"] == "portmap":
                plugin["backend"] = "nftables"
        path = self.root / f"native-{name}"
        path.write_text(json.dumps(data))
        return self.conflist(path, without_reaper=without_reaper, **reaper_conf)

    NATIVE_TABLES = (("inet", "cni_plugins_masquerade"), ("ip", "cni_hostport"), ("ip6", "cni_hostport"))

    def native_rules(self) -> list[str]:
        """The rules of the plugins' native tables, one line each as `nft` prints them (handles aside)."""
        out = []
        for family, table in self.NATIVE_TABLES:
            proc = self.run(["nft", "list", "table", family, table])
            chain = ""
            for line in proc.stdout.splitlines():
                line = line.strip()
                if line.startswith("chain "):
                    chain = line.split()[1]
                elif line and not line.startswith(("type ", "comment ", "}", "table ")):
                    out.append(f"{family} {table} {chain}: {line}")
        return out

    def rules_naming_port(self, port: int, lines: list[str] | None = None) -> list[str]:
        """The plugins' rules (iptables and native; or `lines`) that name `port` outside their comments: a
        container ID in a comment ("alloc-4711-8131") is no port."""
        import re

        if lines is None:
            lines = [l for l in self.tables().splitlines() if "CNI-" in l] + self.native_rules()
        bare = re.compile(r'(--)?comment "(?:[^"\\]|\\.)*"')
        return sorted(re.sub(r" # handle \d+", "", l) for l in lines if re.search(rf"\b{port}\b", bare.sub("", l)))

    def outside(self) -> tuple[str, str]:
        """A client's netns outside the host, joined to it by a veth: (its netns name, the host's address)."""
        name = unique("crt-x")
        sh("ip", "netns", "add", name)
        self.containers.append(name)
        host_if, peer = unique("vh"), unique("vc")
        self.run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer], check=True)
        self.run(["ip", "link", "set", peer, "netns", name], check=True)
        self.run(["sh", "-c", f"ip addr add 10.250.0.1/24 dev {host_if} && ip link set {host_if} up"], check=True)
        sh("ip", "netns", "exec", name, "sh", "-c",
           f"ip addr add 10.250.0.2/24 dev {peer} && ip link set {peer} up && ip link set lo up && "
           f"ip route add default via 10.250.0.1")
        return name, "10.250.0.1"

    def udp_sender(self, netns_name: str, dest: str, port: int, every: float = 0.025) -> subprocess.Popen:
        """A client that keeps sending UDP to dest:port from one source port (as DNS or statsd clients do)."""
        code = ("import socket,sys,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('0.0.0.0',40053))\n"
                "i=0\nwhile True:\n s.sendto(str(i).encode(),(sys.argv[1],int(sys.argv[2])));i+=1;time.sleep(float(sys.argv[3]))")
        return subprocess.Popen(["ip", "netns", "exec", netns_name, sys.executable, "-c", code, dest, str(port), str(every)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def udp_receiver(self, netns: str, port: int) -> subprocess.Popen:
        """A UDP server in a container netns that prints the time of every datagram it receives; returns once
        it is bound (its first line, `ready`, has been read)."""
        code = ("import socket,sys,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('0.0.0.0',int(sys.argv[1])))\n"
                "print('ready',flush=True)\nwhile True:\n s.recvfrom(100);print(time.time(),flush=True)")
        proc = subprocess.Popen(["ip", "netns", "exec", os.path.basename(netns), sys.executable, "-c", code, str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "the UDP receiver did not start"
        return proc

    def state_dir(self) -> Path:
        return self.cni_dir / "reaper"

    def records(self) -> list[dict]:
        d = self.state_dir()
        if not d.exists():
            return []
        return [json.loads(p.read_text()) for p in sorted(d.glob("r-*.json"))]

    def record(self, cid: str) -> dict | None:
        found = [r for r in self.records() if r["containerID"] == cid]
        assert len(found) <= 1
        return found[0] if found else None

    def edit_held(self, cid: str, **mark) -> None:
        """The held mark of `cid`'s record changed by hand (retryAt, tries)."""
        self.edit_record(cid, lambda rec: rec["left"].update(mark))

    def edit_record(self, cid: str, change) -> None:
        """`cid`'s record changed by hand (`change` edits the parsed record in place), the file replaced as
        cni-reaper replaces it (a new inode: the index is made anew from the records)."""
        path = next(p for p in self.state_dir().glob("r-*.json") if json.loads(p.read_text())["containerID"] == cid)
        rec = json.loads(path.read_text())
        change(rec)
        tmp = path.with_name(".tmp.hand")
        tmp.write_text(json.dumps(rec))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """cni-reaper's command line as an operator runs it here, with no conflists but its defaults."""
        return self.run([str(self.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(self.root / "none")])


_drivers: dict[str, str] = {}


def driver_for(runtime: str) -> str:
    """The go-cni driver for a runtime, built once per process; a build or fetch failure fails the test."""
    import pytest

    if runtime not in _drivers:
        try:
            _drivers[runtime] = build_driver(runtime)
        except RuntimeError as exc:
            pytest.fail(str(exc))
    return _drivers[runtime]


def open_sandbox(root: Path, flavour: str, exe: str, stack: Stack = DEBIAN12) -> Sandbox:
    """A sandbox for a test, on a stack; what cannot be fetched or built fails the test, never skips it."""
    import pytest

    needs_root()
    try:
        return Sandbox(root, flavour, exe, driver_for(stack.runtime), stack)
    except RuntimeError as exc:
        pytest.fail(str(exc))


STALL_PLUGIN = r'''#!/usr/bin/env python3
# A chained test plugin, put just before cni-reaper: passes prevResult through, and for a container ID that has a
# `<dir>/<id>.hold` file it stops there (after bridge, firewall and portmap made the attachment's rules and
# reservation, before cni-reaper records it) until `<dir>/<id>.go` exists, saying so with `<dir>/<id>.reached`.
import json, os, sys, time
d = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "..", "stall")  # <sandbox>/plugins/stall -> <sandbox>/stall
cmd, cid = os.environ.get("CNI_COMMAND", ""), os.environ.get("CNI_CONTAINERID", "")
if cmd == "VERSION":
    print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}))
    sys.exit(0)
conf = json.load(sys.stdin)
if cmd == "ADD":
    if os.path.exists(os.path.join(d, cid + ".hold")):
        open(os.path.join(d, cid + ".reached"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(d, cid + ".go")) and time.monotonic() < deadline:
            time.sleep(0.005)
    result = dict(conf.get("prevResult") or {})
    result.setdefault("cniVersion", conf.get("cniVersion", "1.0.0"))
    print(json.dumps(result))
'''


def add_stall_plugin(sb: Sandbox, conflist: Path) -> tuple[Path, Path]:
    """The conflist with the stall plugin just before cni-reaper (written beside it), and the plugin's
    directory of hold/reached/go files. The plugin is found first on the sandbox's plugin path."""
    stall_dir = sb.root / "stall"
    stall_dir.mkdir(exist_ok=True)
    exe = sb.plugin_dir / "stall"
    if not exe.exists():
        exe.write_text(STALL_PLUGIN)
        exe.chmod(0o755)
    data = json.loads(conflist.read_text())
    at = next(i for i, p in enumerate(data["plugins"]) if p["type"] == "cni-reaper")
    data["plugins"].insert(at, {"type": "stall"})
    out = conflist.with_name(conflist.stem + "-stall.conflist")
    out.write_text(json.dumps(data))
    return out, stall_dir


class Held:
    """An ADD held between the reference plugins and cni-reaper (see STALL_PLUGIN): started at construction,
    `wait()` returns once it is held, `release()` lets it finish and returns its result."""

    def __init__(self, sb: Sandbox, conflist: Path, stall_dir: Path, cid: str, netns: str, ports: tuple[str, ...] = ()) -> None:
        self.sb, self.dir, self.cid = sb, stall_dir, cid
        (stall_dir / f"{cid}.hold").touch()
        assert sb.driver_bin, "this sandbox has no go-cni driver"
        argv = [sb.driver_bin, "-conflist", str(conflist), "-plugindir", f"{sb.plugin_dir}:{sb.plugins}", "-op", "add",
                "-id", cid, "-netns", netns, "-ports", "omit"]
        if sb.stack.status:
            argv.append("-status")
        for p in ports:
            argv += ["-port", p]
        self.proc = subprocess.Popen(sb.wrap(argv), env=sb.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not (self.dir / f"{self.cid}.reached").exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the held ADD ended early: {self.proc.stderr.read() if self.proc.stderr else ''}")
            if time.monotonic() > deadline:
                raise AssertionError("the held ADD never reached the stall plugin")
            time.sleep(0.005)

    def release(self) -> subprocess.CompletedProcess:
        (self.dir / f"{self.cid}.go").touch()
        out, err = self.proc.communicate(timeout=120)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


class HungNft:
    """An `nft` first on `path` that, when the shell test `only_if` holds in its environment, says it started
    and waits at a gate before it runs the real one: a tool that hangs while cni-reaper holds a lock others
    wait for. `beside(start, other)`: `start` runs in a thread; once the tool hangs, `other` runs, and must be
    done while the tool still hangs (the gate opens by itself 25 s later, long after any bound of cni-reaper's,
    and at the end in any case); `start`'s result is returned with `other`'s."""

    def __init__(self, sb: Sandbox, only_if: str = "true") -> None:
        self.gate, self.started, stand_in = sb.root / "nft-gate", sb.root / "nft-started", sb.root / "hung-nft"
        real = sb.run(["sh", "-c", "command -v nft"], check=True).stdout.strip()
        stand_in.mkdir(exist_ok=True)
        (stand_in / "nft").write_text(f'#!/bin/sh\nif {only_if}; then echo $$ >> "{self.started}"\n'
                                      f'while [ ! -e "{self.gate}" ]; do sleep 0.05; done; fi\nexec "{real}" "$@"\n')
        (stand_in / "nft").chmod(0o755)
        self.path = f"{stand_in}:{sb.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"

    def beside(self, start, other) -> tuple:
        import threading

        done: dict[str, object] = {}
        first = threading.Thread(target=lambda: done.update(first=start()))
        opener = threading.Timer(25, self.gate.touch)
        first.start()
        try:
            deadline = time.monotonic() + 30
            while not self.started.exists() and first.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert self.started.exists(), f"the tool was never run: {done}"
            opener.start()
            out = other()
            assert not self.gate.exists(), "it waited until the hung tool was let go"
        finally:
            self.gate.touch()
            opener.cancel()
            first.join()
        return done["first"], out
