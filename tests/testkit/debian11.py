"""A Debian 11 root file system without Python, for testing the release where users run it: made once with
debootstrap from Debian's packages (minbase, iptables and nftables: Debian 11's iptables is 1.8.7, both
flavours) and cached in the test cache, for amd64 and for arm64 (unpacked by debootstrap --foreign, its
second stage run under user-mode emulation as scripts/bundle.py does). Each test works in an overlay on top
of it, in a private mount namespace, inside a throwaway network namespace: the cached root and the machine
stay as they were. In an arm64 root, programs run under PRoot and qemu-user (`run_in`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from testkit.cached import made_once

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bundle  # the build's PRoot and qemu-user runner (scripts/bundle.py)

CACHE = Path(os.environ.get("CNI_REAPER_CACHE", "/tmp/cni-reaper-test-cache"))
MIRROR = os.environ.get("CNI_REAPER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("iptables", "nftables")


def root(arch: str = "amd64") -> Path:
    out = CACHE / ("rootfs-bullseye-test" if arch == "amd64" else f"rootfs-bullseye-{arch}-test")

    def make(tmp: Path) -> None:
        if not shutil.which("debootstrap"):
            subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True, capture_output=True)
        foreign = [] if arch == "amd64" else ["--foreign", f"--arch={arch}"]
        proc = subprocess.run(["debootstrap", *foreign, "--variant=minbase", f"--include={','.join(PACKAGES)}",
                               "bullseye", str(tmp), MIRROR], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"debootstrap bullseye ({arch}) failed: {(proc.stderr or proc.stdout)[-800:]}")
        if foreign:
            if (tmp / "proc").is_symlink():  # debootstrap links it to /proc when it thinks it runs in a container
                (tmp / "proc").unlink()
                (tmp / "proc").mkdir()
            proc = subprocess.run(bundle.foreign(tmp, arch, ["/debootstrap/debootstrap", "--second-stage"]),
                                  preexec_fn=bundle._no_statx, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"debootstrap's second stage ({arch}) failed: {(proc.stderr or proc.stdout)[-800:]}")

    return made_once(out, f"debian11-{arch}.lock", make)


def in_overlay(lower: Path, work: Path, script: str, host_netns: str | None = None, timeout: float = 300,
               arch: str = "amd64") -> subprocess.CompletedProcess:
    """Run `script` (sh) in a private mount namespace where $ROOT is an overlay of `lower` whose changes go to
    `work`/upper, with /proc, /dev and /run/netns mounted in it; inside `host_netns` when given. The script
    runs a command inside the root with `in_root COMMAND...`: chroot for amd64, PRoot with qemu-user for a
    foreign architecture (each program it starts emulated, nothing registered with the kernel)."""
    for d in ("upper", "work", "merged"):
        (work / d).mkdir(parents=True, exist_ok=True)
    enter = 'chroot "$ROOT"' if arch == "amd64" else f'proot -q {bundle.QEMU[arch]} -r "$ROOT" -w /'
    script = f'in_root() {{ {enter} "$@"; }}; {script}'
    outer = (f'mount -t overlay overlay -o lowerdir={lower},upperdir={work}/upper,workdir={work}/work {work}/merged'
             f' && export ROOT={work}/merged && mount -t proc proc "$ROOT/proc" && mount --rbind /dev "$ROOT/dev"'
             f' && mkdir -p /run/netns "$ROOT/run/netns" && mount --rbind /run/netns "$ROOT/run/netns" && '
             # PRoot's programs outlive a PRoot killed by the timeout, untranslated: nothing but the root for them
             f'{"" if arch == "amd64" else bundle.confined(f"{work}/merged")}'
             'exec sh -ec "$0"')
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", outer, script]
    if host_netns:
        argv = ["ip", "netns", "exec", host_netns, *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=None if arch == "amd64" else bundle._no_statx)
