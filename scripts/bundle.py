"""Build the one-folder bundle dist/cni-reaper/ the one way it is built, for tests, benchmarks and releases
alike (run by scripts/build.sh, as root, on Debian 12):

1. A Debian 11 root file system (glibc 2.31, Python 3.9) made with debootstrap from Debian's packages and
   cached under build/work/rootfs/ (keyed by what it holds): what the bundle links against is what the
   oldest supported distribution has.
2. In it, a virtualenv with the pinned build requirements (build/requirements-bundle.txt) and PyInstaller
   built from its pinned source distribution (checked against its SHA-256), with two changes: its bootloader
   is compiled there, with zlib inside and with PYI_ONEDIR_NO_RESTART (a one-folder bundle on Linux otherwise
   executes itself a second time to set LD_LIBRARY_PATH; instead, every shared object of the bundle gets an
   $ORIGIN run path with patchelf, so the bundle finds its own libraries and never sets LD_LIBRARY_PATH for
   the programs it runs), and its bootstrap does not import ctypes on every start to hook it.
3. PyInstaller with build/cni-reaper.spec; then the checks: no ELF needs a GLIBC_ symbol newer than 2.31,
   no run path outside the bundle.

Everything inside the root runs in a private mount namespace (`unshare --mount`), so the /proc and /dev
mounts it needs vanish with it. The machine's own apt configuration is never used or changed: debootstrap
takes the mirror on its command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("CNI_REAPER_BUILD_WORK", REPO / "build" / "work"))
MIRROR = os.environ.get("CNI_REAPER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bullseye"
PACKAGES = ["python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "zlib1g-dev", "patchelf", "binutils",
            "ca-certificates", "file"]
PYINSTALLER = ("6.22.3", "05eb2f5615503e72939a7224d68b4aff572c6b0438ee4a17d0a4b481f399362d")
MAX_GLIBC = (2, 31)
SOURCES = ["plugin", "build/cni-reaper.spec", "build/entry.py", "build/requirements-bundle.txt",
           "build/pyinstaller-patch.py", "build/floor.spec", "build/floor", "pyproject.toml", "README.md"]


# Made once per content (the venv's name is a hash of this script and the requirements): the build
# requirements, and PyInstaller from its pinned source with the two patches described at the top.
VENV_SCRIPT = r"""
rm -rf /build/venv-[0-9a-f]* /build/pyinstaller  # earlier build environments go with the one being made
python3 -m venv @VENV@
# -g0: python-iptables' C extension is compiled from its sdist in a temp directory of a random name, which
# debug info would record (and the linker's build ID with it): without it the extension is the same each time
CFLAGS="-O2 -g0" @VENV@/bin/pip install -q --disable-pip-version-check --no-cache-dir \
  -r /build/src/build/requirements-bundle.txt
mkdir -p /build/pyinstaller && cd /build/pyinstaller
@VENV@/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: pyinstaller==@VERSION@
echo "@SHA@  pyinstaller-@VERSION@.tar.gz" | sha256sum -c - >/dev/null
tar xzf pyinstaller-@VERSION@.tar.gz
cd pyinstaller-@VERSION@
python3 /build/src/build/pyinstaller-patch.py
PYINSTALLER_COMPILE_BOOTLOADER=1 PYI_STATIC_ZLIB=1 CFLAGS="-O2 -DPYI_ONEDIR_NO_RESTART" \
  @VENV@/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation .
touch @VENV@/.complete
"""


def say(msg: str) -> None:
    print(f"bundle: {msg}", flush=True)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, **kw)


def rootfs() -> Path:
    """The Debian 11 build root, made once per package list."""
    key = hashlib.sha256(json.dumps([SUITE, MIRROR, PACKAGES]).encode()).hexdigest()[:12]
    root = WORK / "rootfs" / f"{SUITE}-{key}"
    if (root / ".complete").exists():
        return root
    if not shutil.which("debootstrap"):
        say("installing debootstrap")
        run(["apt-get", "install", "-y", "-qq", "debootstrap"], stdout=subprocess.DEVNULL)
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    say(f"debootstrap {SUITE} into {tmp} (once; about a minute)")
    t0 = time.monotonic()
    run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR],
        stdout=subprocess.DEVNULL)
    (tmp / ".complete").write_text(f"{time.monotonic() - t0:.0f} s\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


def in_root(root: Path, script: str, env: dict[str, str] | None = None) -> None:
    """Run a shell script inside the build root, in a private mount namespace."""
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
    outer = (f'mount -t proc proc "{root}/proc" && mount --rbind /dev "{root}/dev" && '
             f'exec chroot "{root}" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 '
             f'/bin/sh -ec "$0"')
    run(["unshare", "--mount", "--propagation", "private", "sh", "-c", outer, exports + script])


def prepare() -> tuple[Path, str]:
    """The build root with the sources copied in and the build virtualenv made: (root, venv path inside)."""
    root = rootfs()
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
        say(f"virtualenv with the build requirements and PyInstaller {version} from source (once)")
        in_root(root, setup.replace("@VENV@", venv))
    return root, venv


def build() -> Path:
    root, venv = prepare()
    build_dir = root / "build"
    say("PyInstaller in the Debian 11 root")
    in_root(root, f"""
cd /build/src
{venv}/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall .
rm -rf /build/dist /build/work
{venv}/bin/python -m PyInstaller --noconfirm --clean --log-level WARN --distpath /build/dist --workpath /build/work \\
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
""", env={"SOURCE_DATE_EPOCH": source_date_epoch(), "PYTHONHASHSEED": "0"})
    dist = REPO / "dist" / "cni-reaper"
    shutil.rmtree(dist, ignore_errors=True)
    shutil.copytree(build_dir / "dist" / "cni-reaper", dist, symlinks=True)
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


def glibc_needed(path: Path) -> tuple[int, ...]:
    text = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True).stdout
    versions = [tuple(int(x) for x in word[len("GLIBC_"):].split("."))
                for line in text.splitlines() for word in line.replace("(", " ").replace(")", " ").split()
                if word.startswith("GLIBC_") and word[6:7].isdigit()]
    return max(versions, default=(0,))


def check(bundle: Path) -> None:
    problems = []
    for path in elf_files(bundle):
        needed = glibc_needed(path)
        if needed > MAX_GLIBC:
            problems.append(f"{path.relative_to(bundle)} needs GLIBC_{'.'.join(map(str, needed))}")
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
    benchmark's floors, built in the same root as cni-reaper."""
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
    if os.geteuid() != 0:
        sys.exit("bundle: run as root (debootstrap, chroot)")
    build_floors() if sys.argv[1:] == ["--floor"] else build()
