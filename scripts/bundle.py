"""Build the one-folder bundle dist/cni-reaper/ (amd64) or dist/arm64/cni-reaper/ the one way it is built, for
tests, benchmarks and releases alike (run by scripts/build.sh [--arch amd64|arm64], as root, on Debian 12):

1. A Debian 11 root file system of the target architecture (Python 3.9) made with debootstrap from Debian's
   packages and cached once per machine under /var/cache/cni-reaper/build/rootfs/ (CNI_REAPER_BUILD_CACHE; keyed
   by what it holds, and so is the build virtualenv made in it: a fresh clone, CI's, builds in the root an
   earlier clone made, one build at a time). For arm64 its packages are
   unpacked by debootstrap --foreign here and configured (its second stage) under user-mode emulation, as
   is everything later run in it: see `in_root`.
2. In it, a virtualenv with the pinned build requirements (build/requirements-bundle.txt) and PyInstaller
   built from its pinned source distribution (checked against its SHA-256), with two changes: its bootloader
   is compiled there, with zlib inside and with PYI_ONEDIR_NO_RESTART (a one-folder bundle on Linux otherwise
   executes itself a second time to set LD_LIBRARY_PATH; instead, every shared object of the bundle gets an
   $ORIGIN run path with patchelf, so the bundle finds its own libraries and never sets LD_LIBRARY_PATH for
   the programs it runs), and its bootstrap does not import ctypes on every start to hook it.
3. PyInstaller with build/cni-reaper.spec, on the target architecture (it does not cross-build).
4. The glibc floor (scripts/elfver.py): Debian 11's libpython3.9 calls exp, log, log2 and pow at the
   versions glibc 2.29 gave them; those references are made unversioned, which binds the versions every
   glibc since 2.2.5 (x86_64) / 2.17 (aarch64) has, and the unused GLIBC_2.29 requirement is dropped.
   Nothing else is changed, and any other need above the floor fails the build.
5. The checks, on every ELF file: no GLIBC_ version above 2.28 needed (symbols and version requirements),
   no run path outside the bundle.

Everything inside the root runs in a private mount namespace (`unshare --mount`), so the /proc and /dev
mounts it needs vanish with it. The machine's own apt configuration is never used or changed: debootstrap
takes the mirror on its command line. Foreign (arm64) programs run under qemu-user through PRoot, per
process: no binfmt handler is registered with the kernel, none is needed; in their namespace every mount of
the machine but the root, /tmp, /run and the kernel's is read-only (`confined`), so that programs outliving a
killed PRoot, untranslated, cannot write the machine's files.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import elfver

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "build"))
import codeindex

WORK = Path(os.environ.get("CNI_REAPER_BUILD_WORK", REPO / "build" / "work"))
CACHE = Path(os.environ.get("CNI_REAPER_BUILD_CACHE", "/var/cache/cni-reaper/build"))  # once per machine
MIRROR = os.environ.get("CNI_REAPER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bullseye"
PACKAGES = ["python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "zlib1g-dev", "patchelf", "binutils",
            "ca-certificates", "file"]
PYINSTALLER = ("6.22.3", "05eb2f5615503e72939a7224d68b4aff572c6b0438ee4a17d0a4b481f399362d")
ARCHES = ("amd64", "arm64")
HOST_ARCH = "amd64"  # the build machine: Debian 12 on x86_64
QEMU = {"arm64": "qemu-aarch64-static"}
# RHEL 8 and its clones (glibc 2.28) are the oldest distributions the release is built to run on
MAX_GLIBC = (2, 28)
# the only symbols the floor may change the version of: glibc 2.29 gave these new symbol versions (the
# implementations without the SVID error-handling wrapper); the old versions stay exported by every glibc
LOWERED = {"exp", "log", "log2", "pow"}
SOURCES = ["plugin", "build/cni-reaper.spec", "build/entry.py", "build/codeindex.py", "build/requirements-bundle.txt",
           "build/pyinstaller-patch.py", "build/floor.spec", "build/floor", "pyproject.toml", "README.md"]


# Made once per content (the venv's name is a hash of this script and the requirements): the build
# requirements, and PyInstaller from its pinned source with the two patches described at the top.
VENV_SCRIPT = r"""
rm -rf /build/venv-[0-9a-f]*  # earlier build environments go with the one being made
python3 -m venv @VENV@
# the pinned pip, setuptools and wheel first, so that what is built from source below is built with them
# (--no-build-isolation: no build environment of unpinned packages; under emulation each costs minutes)
grep -E '^(pip|setuptools|wheel)==' /build/src/build/requirements-bundle.txt > /build/base-requirements.txt
again @VENV@/bin/pip install -q --disable-pip-version-check --no-cache-dir -r /build/base-requirements.txt
# -g0: python-iptables' C extension is compiled from its sdist in a temp directory of a random name, which
# debug info would record (and the linker's build ID with it): without it the extension is the same each time
again env CFLAGS="-O2 -g0" @VENV@/bin/pip install -q --disable-pip-version-check --no-cache-dir \
  --no-build-isolation -r /build/src/build/requirements-bundle.txt
cd /build/pyinstaller  # its source distribution, downloaded by the build machine's pip (see sdist())
echo "@SHA@  pyinstaller-@VERSION@.tar.gz" | sha256sum -c - >/dev/null
tar xzf pyinstaller-@VERSION@.tar.gz
cd pyinstaller-@VERSION@
python3 /build/src/build/pyinstaller-patch.py
again env PYINSTALLER_COMPILE_BOOTLOADER=1 PYI_STATIC_ZLIB=1 CFLAGS="-O2 -DPYI_ONEDIR_NO_RESTART" \
  @VENV@/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation .
touch @VENV@/.complete
"""

# `again COMMAND...`, for the steps of an in-root script that may be run twice: under PRoot and qemu-user an
# execve now and then fails with EFAULT for no reason of its own (seen once in CI: `OSError: [Errno 14] Bad
# address: '/usr/bin/gcc'` while PyInstaller's bootloader was compiled, after a hundred gcc runs had passed)
AGAIN = r"""again() {
  n=1
  until "$@"; do
    [ "$n" -lt 3 ] || return 1
    n=$((n + 1))
    echo "bundle: '$*' failed; attempt $n of 3 (under emulation an execve can fail spuriously)" >&2
  done
}
"""


def say(msg: str) -> None:
    print(f"bundle: {msg}", flush=True)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, **kw)


def need_tool(command: str, package: str) -> None:
    """A Debian package the build needs on the machine, installed without its recommends: qemu-user-static
    recommends binfmt-support, which would register handlers with the kernel."""
    if not shutil.which(command):
        say(f"installing {package}")
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], stdout=subprocess.DEVNULL)


def _no_statx() -> None:
    """In the child, before it execs: statx, faccessat2 and openat2 answer ENOSYS for it and everything it
    starts. PRoot 5.1 (Debian 12) does not translate the paths of these newer calls, so a foreign program's
    statx (qemu passes the guest's through) would look at the machine's own file system; with ENOSYS, qemu and
    glibc fall back to the calls PRoot translates (fstatat, faccessat, openat)."""
    libc = ctypes.CDLL(None, use_errno=True)
    # seccomp BPF: on x86_64, syscalls 332 (statx), 437 (openat2) and 439 (faccessat2) -> ERRNO(ENOSYS)
    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return code.to_bytes(2, "little") + bytes([jt, jf]) + k.to_bytes(4, "little")
    ld, jeq, ret, allow, enosys = 0x20, 0x15, 0x06, 0x7FFF0000, 0x00050000 | 38
    prog = b"".join([op(ld, 0, 0, 4), op(jeq, 0, 5, 0xC000003E), op(ld, 0, 0, 0), op(jeq, 2, 0, 332),
                     op(jeq, 1, 0, 437), op(jeq, 0, 1, 439), op(ret, 0, 0, enosys), op(ret, 0, 0, allow)])
    buf = ctypes.create_string_buffer(prog, len(prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(317, 1, 0, ctypes.byref(fprog)) != 0:  # NO_NEW_PRIVS, seccomp
        raise OSError(ctypes.get_errno(), "seccomp filter")


# what a confined command may still write to beside its root: what the kernel keeps, and the scratch
# directories (PRoot makes its own files in /tmp, whatever PROOT_TMP_DIR says in Debian 12's 5.3.0)
WRITABLE = ("/proc", "/sys", "/dev", "/tmp", "/run")


def confined(root: Path | str) -> str:
    """sh that, run first in a private mount namespace, leaves writable only `root` (and WRITABLE): every other
    mount of the machine is made read-only there, there only. PRoot translates the paths of the programs it
    runs; should it die before them (a SIGKILL, a timeout), the programs it traced go on untranslated, and
    what they write lands on the machine's own files: a second stage killed half-way once unpacked arm64's
    tar over the build machine's. Fails (exit 1) when / cannot be made read-only."""
    keep = f'"{root}"|"{root}"/*|' + "|".join(f"{m}|{m}/*" for m in WRITABLE)
    return (f'mount --rbind "{root}" "{root}" && '
            f'for d in {" ".join(WRITABLE)}; do [ ! -d "$d" ] || mountpoint -q "$d" || mount --rbind "$d" "$d" || exit 1; '
            "done && "
            "for m in $(awk '{print $2}' /proc/self/mounts | sort -u); do "
            f'case "$m" in {keep}) ;; *) mount -o remount,bind,ro "$m" 2>/dev/null || [ "$m" != / ] || exit 1 ;; '
            "esac; done && ")


def foreign(root: Path, arch: str, argv: list[str]) -> list[str]:
    """argv (a command line inside `root`) run in a private mount namespace under PRoot, which runs each
    program, and each program those start, with qemu-user (`proot -q`): emulation per process, nothing
    registered with the kernel; in that namespace nothing but `root` can be written (`confined`). Run it
    with preexec_fn=_no_statx."""
    need_tool("proot", "proot")
    need_tool(QEMU[arch], "qemu-user-static")
    inner = " ".join(f"'{a}'" for a in ["proot", "-q", QEMU[arch], "-r", str(root), "-b", "/proc", "-b", "/dev",
                                        "-b", "/sys", "-w", "/"])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'{confined(root)}exec {inner} "$@"', "sh", *argv]


def run_foreign(root: Path, arch: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    return run(foreign(root, arch, argv), preexec_fn=_no_statx, **kw)


def rootfs(arch: str = HOST_ARCH) -> Path:
    """The Debian 11 build root of an architecture, made once per package list."""
    key = hashlib.sha256(json.dumps([SUITE, MIRROR, PACKAGES] + ([] if arch == HOST_ARCH else [arch])).encode()
                         ).hexdigest()[:12]
    root = CACHE / "rootfs" / (f"{SUITE}-{key}" if arch == HOST_ARCH else f"{SUITE}-{arch}-{key}")
    if (root / ".complete").exists():
        return root
    need_tool("debootstrap", "debootstrap")
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if arch == HOST_ARCH:
        say(f"debootstrap {SUITE} into {tmp} (once; about a minute)")
        run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR],
            stdout=subprocess.DEVNULL)
    else:
        say(f"debootstrap --foreign --arch={arch} {SUITE} into {tmp}, then its second stage under emulation (once)")
        run(["debootstrap", "--foreign", f"--arch={arch}", "--variant=minbase", f"--include={','.join(PACKAGES)}",
             SUITE, str(tmp), MIRROR], stdout=subprocess.DEVNULL)
        proc = tmp / "proc"
        if proc.is_symlink():  # debootstrap links it to /proc when it thinks it runs in a container
            proc.unlink()
            proc.mkdir()
        run_foreign(tmp, arch, ["/debootstrap/debootstrap", "--second-stage"], stdout=subprocess.DEVNULL)
    (tmp / ".complete").write_text(f"{time.monotonic() - t0:.0f} s\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


def in_root(root: Path, script: str, env: dict[str, str] | None = None, arch: str = HOST_ARCH) -> None:
    """Run a shell script inside the build root, in a private mount namespace (for a foreign architecture:
    under PRoot and qemu-user)."""
    resolv = Path("/etc/resolv.conf")
    if resolv.exists():
        (root / "etc" / "resolv.conf").write_text(resolv.read_text())
    env = dict(env or {})
    # the machine's trust for the package registries (a proxy's CA may sit in it), and its pip index
    ca = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
    if ca.is_file():
        (root / "build").mkdir(exist_ok=True)
        shutil.copy(ca, root / "build" / "host-ca.crt")
        env.update(PIP_CERT="/build/host-ca.crt", SSL_CERT_FILE="/build/host-ca.crt")
    for name in ("PIP_INDEX_URL", "PIP_DEFAULT_TIMEOUT", "HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    exports = "".join(f"export {k}='{v}'; " for k, v in env.items())
    inner = ["/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LC_ALL=C.UTF-8",
             "/bin/sh", "-ec", exports + AGAIN + script]
    if arch != HOST_ARCH:
        run_foreign(root, arch, inner)
        return
    outer = (f'mount -t proc proc "{root}/proc" && mount --rbind /dev "{root}/dev" && '
             f'exec chroot "{root}" "$@"')
    run(["unshare", "--mount", "--propagation", "private", "sh", "-c", outer, "sh", *inner])


def sdist() -> Path:
    """PyInstaller's pinned source distribution, checked against its SHA-256, downloaded once with the build
    machine's own pip for every architecture (pip prepares an sdist's metadata before it keeps the file:
    two minutes under emulation, half a minute here)."""
    version, sha = PYINSTALLER
    out = CACHE / "downloads" / f"pyinstaller-{version}.tar.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:  # release.sh builds the architectures side by side
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists() or hashlib.sha256(out.read_bytes()).hexdigest() != sha:
            tmp = out.parent / "tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                 "--no-binary", ":all:", "-d", str(tmp), f"pyinstaller=={version}"])
            got = tmp / out.name
            if hashlib.sha256(got.read_bytes()).hexdigest() != sha:
                raise SystemExit(f"bundle: {got.name} does not have the pinned SHA-256 {sha}")
            got.rename(out)
            shutil.rmtree(tmp)
    return out


def prepare(arch: str = HOST_ARCH) -> tuple[Path, str]:
    """The build root with the sources copied in and the build virtualenv made: (root, venv path inside)."""
    root = rootfs(arch)
    build_dir = root / "build"
    src = build_dir / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for rel in SOURCES:
        source = REPO / rel
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
        else:
            shutil.copy2(source, target)
    version, sha = PYINSTALLER
    setup = VENV_SCRIPT.replace("@VERSION@", version).replace("@SHA@", sha)
    inputs = b"".join((REPO / "build" / name).read_bytes() for name in ("requirements-bundle.txt", "pyinstaller-patch.py"))
    venv_key = hashlib.sha256(inputs + setup.encode()).hexdigest()[:12]
    venv = f"/build/venv-{venv_key}"
    if not (root / venv.lstrip("/") / ".complete").exists():
        say(f"{arch}: virtualenv with the build requirements and PyInstaller {version} from source (once)")
        t0 = time.monotonic()
        shutil.rmtree(build_dir / "pyinstaller", ignore_errors=True)
        (build_dir / "pyinstaller").mkdir(parents=True)
        shutil.copy(sdist(), build_dir / "pyinstaller")
        in_root(root, setup.replace("@VENV@", venv), arch=arch)
        say(f"{arch}: virtualenv made in {time.monotonic() - t0:.0f} s")
    return root, venv


def dist_dir(arch: str = HOST_ARCH) -> Path:
    """Where the bundle lands: dist/cni-reaper for the build machine's architecture (what the suite runs),
    dist/<arch>/cni-reaper for another."""
    return REPO / "dist" / "cni-reaper" if arch == HOST_ARCH else REPO / "dist" / arch / "cni-reaper"


def build(arch: str = HOST_ARCH) -> Path:
    """The bundle of `arch`, built in its root, which is the machine's: one build in it at a time."""
    lock = CACHE / f"build-{arch}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return _build(arch)


def _build(arch: str) -> Path:
    root, venv = prepare(arch)
    build_dir = root / "build"
    say(f"{arch}: PyInstaller in the Debian 11 root")
    t0 = time.monotonic()
    in_root(root, f"""
cd /build/src
{venv}/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall .
rm -rf /build/dist /build/work
again {venv}/bin/python -m PyInstaller --noconfirm --clean --log-level WARN --distpath /build/dist --workpath /build/work \\
  build/cni-reaper.spec
cd /build/dist/cni-reaper
# $ORIGIN run paths: each shared object finds the bundle's libraries relative to itself
find cni-reaper.lib -type f \\( -name '*.so' -o -name '*.so.*' \\) | while read -r f; do
  if file -b "$f" | grep -q '^ELF'; then
    up=$(dirname "$f" | sed 's|^cni-reaper.lib||; s|/[^/]*|/..|g')
    patchelf --set-rpath "\\$ORIGIN$up" "$f"
  fi
done
strip --strip-unneeded cni-reaper.lib/*.so* cni-reaper.lib/python3*/lib-dynload/*.so 2>/dev/null || true
""", env={"SOURCE_DATE_EPOCH": source_date_epoch(), "PYTHONHASHSEED": "0"}, arch=arch)
    say(f"{arch}: PyInstaller and patchelf took {time.monotonic() - t0:.0f} s")
    dist = dist_dir(arch)
    shutil.rmtree(dist, ignore_errors=True)
    dist.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(build_dir / "dist" / "cni-reaper", dist, symlinks=True)
    held = codeindex.write(str(dist / "cni-reaper.lib"), frozenset(sys.stdlib_module_names))
    say(f"{arch}: code index of {held} modules (build/codeindex.py)")
    floor(dist)
    check(dist)
    return dist


def source_date_epoch() -> str:
    """The last commit's time, so that the same commit builds the same bundle."""
    try:
        return subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True,
                              check=True).stdout.strip() or "0"
    except (OSError, subprocess.CalledProcessError):
        return "0"


def elf_files(bundle: Path) -> list[Path]:
    out = []
    for p in sorted(bundle.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def floor(bundle: Path) -> None:
    """Bring every ELF file to MAX_GLIBC where only the LOWERED symbols stand above it (scripts/elfver.py)."""
    for path in elf_files(bundle):
        for change in elfver.lower(path, MAX_GLIBC, LOWERED):
            say(f"glibc floor: {path.relative_to(bundle)}: {change}")


def check(bundle: Path) -> None:
    problems = []
    for path in elf_files(bundle):
        too_new = {where: v for where, v in elfver.needed(path).items() if v > MAX_GLIBC}
        problems += [f"{path.relative_to(bundle)} needs {where}" for where in sorted(too_new)]
        dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
        for line in dyn.splitlines():
            if "(RUNPATH)" in line or "(RPATH)" in line:
                paths = line.split("[", 1)[1].rstrip("]").split(":")
                problems += [f"{path.relative_to(bundle)} has run path {p}" for p in paths if not p.startswith("$ORIGIN")]
    if problems:
        raise SystemExit("bundle: " + "; ".join(problems))
    say(f"{bundle}: {len(elf_files(bundle))} ELF files, none needs more than GLIBC_{'.'.join(map(str, MAX_GLIBC))}")


def build_floors() -> None:
    """dist/floor (cni-reaper's bootloader) and dist/floor-stock (PyInstaller's own, which restarts): the
    benchmark's floors, built in the same root as cni-reaper (one build in it at a time)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"build-{HOST_ARCH}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _build_floors()


def _build_floors() -> None:
    root, venv = prepare()
    version = PYINSTALLER[0]
    in_root(root, f"""
[ -e /build/venv-stock/.complete ] || {{ rm -rf /build/venv-stock && python3 -m venv /build/venv-stock &&
  /build/venv-stock/bin/pip install -q --disable-pip-version-check pyinstaller=={version} \
    pyinstaller-hooks-contrib==2026.9 && touch /build/venv-stock/.complete; }}
cd /build/src && rm -rf /build/floors && mkdir -p /build/floors
FLOOR_NAME=floor {venv}/bin/python -m PyInstaller --noconfirm --log-level ERROR --distpath /build/floors \
  --workpath /build/work-floor build/floor.spec
FLOOR_NAME=floor-stock /build/venv-stock/bin/python -m PyInstaller --noconfirm --log-level ERROR \
  --distpath /build/floors --workpath /build/work-floor-stock build/floor.spec
cd /build/floors/floor && find floor.lib -type f -name '*.so*' | while read -r f; do
  up=$(dirname "$f" | sed 's|^floor.lib||; s|/[^/]*|/..|g'); patchelf --set-rpath "\\$ORIGIN$up" "$f"; done
""")
    for name in ("floor", "floor-stock"):
        shutil.rmtree(REPO / "dist" / name, ignore_errors=True)
        shutil.copytree(root / "build" / "floors" / name, REPO / "dist" / name, symlinks=True)
    say("built dist/floor and dist/floor-stock")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="build the one-folder bundle (as root, on Debian 12)")
    parser.add_argument("--arch", choices=ARCHES, default=HOST_ARCH)
    parser.add_argument("--floor", action="store_true", help="the benchmark's floors instead (build machine's arch)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bundle: run as root (debootstrap, chroot)")
    build_floors() if args.floor else build(args.arch)
