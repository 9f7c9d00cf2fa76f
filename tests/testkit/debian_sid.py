"""Packages from Debian unstable for tests, fetched without touching the machine's apt configuration.

The reference plugins Nomad users download today (1.9.x) and the runtime Nomad 1.9.5+ links (go-cni 1.1.13
over libcni 1.3, built with Go 1.27) are packaged in Debian unstable and run on Debian 12. They are fetched
with a private source list, private package lists and a private cache (`apt-get -o Dir::...`), then
unpacked with `dpkg-deb -x` into one folder under the test cache: nothing is installed, the machine's
sources and package database stay as they were. Fetched once per cache (CNI_REAPER_CACHE, default
/tmp/cni-reaper-test-cache); a failure raises with the reason (callers fail the test, never skip it).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("CNI_REAPER_CACHE", "/tmp/cni-reaper-test-cache"))
MIRROR = os.environ.get("CNI_REAPER_SID_MIRROR", "http://deb.debian.org/debian")
PLUGINS = ["containernetworking-plugins"]
RUNTIME = ["golang-github-containerd-go-cni-dev", "golang-github-appc-cni-dev", "golang-1.27-go", "golang-1.27-src",
           "golang-github-sasha-s-go-deadlock-dev", "golang-github-petermattis-goid-dev",
           "golang-github-vishvananda-netns-dev"]


class FetchError(RuntimeError):
    pass


def _apt(base: Path, *args: str, cwd: Path | None = None) -> None:
    opts = [f"-o=Dir::Etc::sourcelist={base / 'sources.list'}", "-o=Dir::Etc::sourceparts=/dev/null",
            f"-o=Dir::State::Lists={base / 'lists'}", f"-o=Dir::Cache={base / 'cache'}",
            "-o=APT::Sandbox::User=root", "-o=Debug::NoLocking=1", "-o=Acquire::Retries=3", "-qq"]
    proc = subprocess.run(["apt-get", *opts, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(f"apt-get {' '.join(args)} (Debian unstable, {MIRROR}) failed: "
                         f"{(proc.stderr or proc.stdout).strip()[-800:]}")


def root(group: str) -> Path:
    """The unpacked packages of `group` ("plugins" or "runtime"): a folder with usr/... inside."""
    names = {"plugins": PLUGINS, "runtime": RUNTIME}[group]
    out = CACHE / f"sid-{group}"
    if (out / ".complete").exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "sid.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / ".complete").exists():
            return out
        base = CACHE / "sid-apt"
        for d in ("lists/partial", "cache/archives/partial", "debs"):
            (base / d).mkdir(parents=True, exist_ok=True)
        (base / "sources.list").write_text(f"deb {MIRROR} sid main\n")
        if not any((base / "lists").glob("*Packages*")):
            _apt(base, "update")
        debs = base / "debs"
        _apt(base, "download", *names, cwd=debs)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name in names:
            found = sorted(debs.glob(f"{name}_*.deb"))
            if not found:
                raise FetchError(f"{name} was not downloaded from Debian unstable")
            subprocess.run(["dpkg-deb", "-x", str(found[-1]), str(tmp)], check=True)
            (tmp / f".{name}.deb").write_text(found[-1].name + "\n")
        (tmp / ".complete").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def plugins_dir() -> Path:
    return root("plugins") / "usr" / "lib" / "cni"
