"""A Debian 12 machine booted by a real systemd, for the operator's install end to end (issues 32 and 35):
a root file system made once with debootstrap from Debian's packages (minbase with systemd, iptables,
nftables, iproute2 and the reference plugins) and cached in the test cache, booted by `systemd-nspawn -b`
with `--volatile=overlay` (every change goes to a tmpfs over the cached root and is gone when it stops) and
`--private-network` (its own network namespace: nothing of the machine's tables is touched), not
registered with the machine's systemd. Commands run inside it with nsenter into its PID 1's namespaces.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from testkit.cached import made_once

CACHE = Path(os.environ.get("CNI_REAPER_CACHE", "/tmp/cni-reaper-test-cache"))
MIRROR = os.environ.get("CNI_REAPER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("systemd", "systemd-sysv", "dbus", "iptables", "nftables", "iproute2", "conntrack", "procps",
            "containernetworking-plugins")


class CannotBoot(Exception):
    """This machine cannot boot a container (no systemd-nspawn, or it refuses): the caller skips, saying why."""


def root() -> Path:
    """The cached Debian 12 root with systemd (made on first use: debootstrap, a few minutes)."""

    def make(tmp: Path) -> None:
        proc = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", "bookworm",
                               str(tmp), MIRROR], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"debootstrap bookworm failed: {(proc.stderr or proc.stdout)[-800:]}")

    return made_once(CACHE / "rootfs-bookworm-systemd", "bookworm-systemd.lock", make)


class Machine:
    """A booted container: `run(script)` runs sh -c in it (as root, in all its namespaces)."""

    def __init__(self, lower: Path, binds: dict[str, str], log: Path) -> None:
        if not shutil.which("systemd-nspawn"):
            raise CannotBoot("systemd-nspawn is not installed (Debian's systemd-container)")
        argv = ["systemd-nspawn", "-D", str(lower), "--volatile=overlay", "-b", "--register=no", "--keep-unit",
                "--private-network", "-q", *[f"--bind-ro={src}:{dst}" for src, dst in binds.items()]]
        self.log = log
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.leader = self._leader()

    def _leader(self, timeout: float = 60) -> int:
        """The container's PID 1 (systemd), once it says the system is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CannotBoot(f"systemd-nspawn ended ({self.proc.returncode}): {self.log.read_text()[-600:]}")
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            if pids:
                state = subprocess.run(["nsenter", "-t", pids[0], "-a", "systemctl", "is-system-running"],
                                       capture_output=True, text=True)
                if state.stdout.strip() in ("running", "degraded"):
                    return int(pids[0])
            time.sleep(0.2)
        self.stop()
        raise CannotBoot(f"the container did not finish booting in {timeout:g}s: {self.log.read_text()[-600:]}")

    def run(self, script: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(["nsenter", "-t", str(self.leader), "-a", "/bin/sh", "-c", script], capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"in the container: {script}\nrc {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def stop(self) -> None:
        """Power it off (its tmpfs and namespaces go with it)."""
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM to systemd-nspawn: it asks the container's systemd to power off
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
