"""The release (scripts/release.sh) where users run it, for each architecture (amd64 natively, arm64 under
user-mode emulation in a Debian 11 arm64 root): the tarball and its checksum, the .deb installed and removed
in a throwaway root, the bundle in a Debian 11 root without Python (iptables 1.8.7, both flavours), no ELF
file needing a glibc newer than 2.28 (RHEL 8), the math whose symbol versions the build changed computing
what it did before, and a clean-up that runs nothing but the tools it drives. The rest of the suite runs
against the same amd64 bundle (dist/cni-reaper)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from testkit import debian11, mathprobe
from testkit.artifacts import leak, restore_text
from testkit.sandbox import REPO, open_sandbox, sh, unique

pytestmark = [pytest.mark.netns, pytest.mark.release]
DIST = REPO / "dist"
MONITORING = REPO / "build" / "monitoring"
MAX_GLIBC = (2, 28)  # RHEL 8 and its clones
ARCHES = ("amd64", "arm64")
E_MACHINE = {"amd64": 62, "arm64": 183}  # EM_X86_64, EM_AARCH64
OLD_MATH = {"amd64": "GLIBC_2.2.5", "arm64": "GLIBC_2.17"}  # the versions of exp & co. before glibc 2.29


def version() -> str:
    found = re.search(r'__version__ = "([^"]+)"', (REPO / "plugin" / "cni_reaper" / "__init__.py").read_text())
    assert found is not None
    return found.group(1)


def bundle_dir(arch: str) -> Path:
    return DIST / "cni-reaper" if arch == "amd64" else DIST / arch / "cni-reaper"


@pytest.fixture(scope="module", params=ARCHES)
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def release(arch) -> dict[str, Path]:
    return release_files(arch)


def release_files(arch: str) -> dict[str, Path]:
    v = version()
    files = {"tgz": DIST / f"cni-reaper-{v}-linux-{arch}.tgz", "sha256": DIST / f"cni-reaper-{v}-linux-{arch}.tgz.sha256",
             "deb": DIST / f"cni-reaper_{v}_{arch}.deb"}
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        pytest.fail(f"no release built ({', '.join(missing)}): run scripts/release.sh (scripts/test.sh does)")
    return files


@pytest.fixture(scope="module")
def bullseye(arch) -> Path:
    return bullseye_root(arch)


def bullseye_root(arch: str) -> Path:
    try:
        return debian11.root(arch)
    except RuntimeError as exc:
        pytest.fail(str(exc))


def test_the_tarball_holds_the_bundle_as_the_reference_plugins_lay_theirs_out(release, arch):
    digest = hashlib.sha256(release["tgz"].read_bytes()).hexdigest()
    assert release["sha256"].read_text() == f"{digest}  {release['tgz'].name}\n"
    with tarfile.open(release["tgz"]) as tar:
        names = tar.getnames()
        top = {n.split("/")[0] for n in names}
        assert top == {"cni-reaper", "cni-reaper.lib", "wrap", "monitoring"}
        for shipped in MONITORING.iterdir():  # the Prometheus rules, their tests, the Grafana dashboard
            member = tar.getmember(f"monitoring/{shipped.name}")
            assert member.mode == 0o644 and tar.extractfile(member).read() == shipped.read_bytes()
        link = tar.getmember("wrap/portmap")  # wrap mode's directory, inert until it is put on cni_path
        assert link.issym() and link.linkname == "../cni-reaper"
        exe = tar.getmember("cni-reaper")
        assert exe.isfile() and exe.mode & 0o111 and (exe.uid, exe.gid) == (0, 0)
        header = tar.extractfile(exe).read(20)
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == E_MACHINE[arch]
    bundle = bundle_dir(arch)  # the bundle as built, untouched by the packaging; wrap/ and monitoring/ beside it
    on_disk = [str(p.relative_to(bundle)) for p in bundle.rglob("*")]
    beside = ["wrap", "wrap/portmap", "monitoring", *(f"monitoring/{f.name}" for f in MONITORING.iterdir())]
    assert sorted(names) == sorted(on_disk + beside)


def elf_files(bundle: Path) -> list[Path]:
    out = []
    for p in sorted(bundle.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def glibc_versions(path: Path) -> list[tuple[int, ...]]:
    """Every GLIBC_ version the file names, read by binutils' readelf (any architecture): the versions of its
    dynamic symbols and its version requirements (.gnu.version_r: the dynamic linker refuses a file whose
    requirement the C library lacks, whether a symbol still uses it or not)."""
    text = "".join(subprocess.run(["readelf", "-W", flag, str(path)], capture_output=True, text=True, check=True).stdout
                   for flag in ("--dyn-syms", "--version-info"))
    return [tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", text)]


def test_no_elf_file_needs_a_glibc_newer_than_2_28(arch):
    bundle = bundle_dir(arch)
    files = elf_files(bundle)
    assert len(files) > 10 and bundle / "cni-reaper" in files
    newest = {str(path.relative_to(bundle)): max(glibc_versions(path), default=(0,)) for path in files}
    too_new = {p: v for p, v in newest.items() if v > MAX_GLIBC}
    assert not too_new, too_new
    assert max(newest.values()) >= (2, 17), "readelf read nothing?"
    # the math symbols the build lowered: unversioned references now, and libm.so.6 needs nothing newer
    libpython = next(p for p in files if p.name.startswith("libpython3"))
    syms = subprocess.run(["readelf", "-W", "--dyn-syms", str(libpython)], capture_output=True, text=True).stdout
    refs = {line.split()[-1] for line in syms.splitlines() if " UND " in line}
    assert {"exp", "log", "log2", "pow"} <= refs, sorted(r for r in refs if r.startswith(("exp", "log", "pow")))


def test_the_shipped_interpreter_computes_the_math_right_on_debian_11s_libc(tmp_path, release, bullseye, arch):
    """The release's own executable and libpython (a copy of the extracted tarball whose plugin module is
    testkit/mathprobe's), run on Debian 11's glibc (arm64 under emulation): exp, log, log2, pow and float **
    on edge cases and 1,200 draws give what this machine's Python gives with the current symbol versions
    (the same exceptions, values at most 1 ulp apart), and libpython's GOT holds the C library's old
    versions of the four functions (what an unversioned reference binds to), not GLIBC_2.29's."""
    cases = mathprobe.cases()
    (tmp_path / "cases.json").write_text(mathprobe.encode(cases))
    extracted = tmp_path / "extracted"
    extracted.mkdir()
    with tarfile.open(release["tgz"]) as tar:
        tar.extractall(extracted)
    mathprobe.make_probe(extracted, tmp_path / "probe")
    script = (f'mkdir -p "$ROOT/opt/probe" && cp -a {tmp_path}/probe/. "$ROOT/opt/probe/" && '
              f'cp {tmp_path}/cases.json "$ROOT/tmp/" && '
              f'in_root /usr/bin/env -i LD_BIND_NOW=1 /opt/probe/cni-reaper < "$ROOT/tmp/cases.json"')
    proc = debian11.in_overlay(bullseye, tmp_path / "ovl", script, arch=arch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["machine"] == {"amd64": "x86_64", "arm64": "aarch64"}[arch]
    assert len(out["results"]) == len(cases) > 1000
    assert mathprobe.mismatches(cases, out["results"]) == []
    for name, b in out["bound"].items():
        old, new = b["versions"][OLD_MATH[arch]], b["versions"]["GLIBC_2.29"]
        assert old and new and old != new, (name, b)  # Debian 11's libm has both versions, distinct
        assert b["got"] == old, f"{name} is bound to {b['got']:#x}, not {OLD_MATH[arch]} ({old:#x}; 2.29: {new:#x})"


def test_a_legacy_clean_up_runs_nothing_but_the_tools_it_drives(tmp_path):  # amd64: the bundle the suite runs
    """Under strace: the bundle execs iptables-legacy-save (reading) and, with an nft binary on the host, nft
    (the plugins' native tables); python-iptables finds its libraries without ldconfig or gcc, and nothing
    reads a path of the machine the bundle was built on."""
    exe = str(DIST / "cni-reaper" / "cni-reaper")
    with open_sandbox(tmp_path, "legacy", exe) as sb:
        cid, ip = unique("alloc-"), "172.26.64.9"
        netns = sb.container()
        prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": netns}], "ips": [{"address": f"{ip}/20"}]}
        conf = dict(sb.status_conf(cniVersion="1.0.0"), prevResult=prev)
        assert sb.plugin("ADD", conf, cid=cid, netns=netns)[0] == 0
        nat, filt, _ = leak("nomad-reaper", cid, ip, 8080)
        sb.run([str(sb.bin_dir / "iptables-restore"), "--noflush"], input=restore_text(nat, filt), check=True)
        sb.remove_container(netns)
        trace = tmp_path / "trace"
        env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_NETNS": netns, "CNI_IFNAME": "eth0",
               "CNI_PATH": str(sb.plugin_dir)}
        proc = sb.run(["strace", "-f", "-qq", "-e", "trace=execve,openat,open", "-o", str(trace), exe], env=env,
                      input=json.dumps(conf))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert sb.residue("nomad-reaper", cid, [ip]) == [], "the clean-up did not run"
        assert '"backend":"python-iptables"' in proc.stderr
        lines = trace.read_text().splitlines()
        ran = {os.path.basename(m.group(1)) for l in lines if (m := re.search(r'execve\("([^"]+)"', l)) and "= 0" in l}
        assert ran <= {"cni-reaper", "iptables-legacy-save", "ip6tables-legacy-save", "nft"}, ran
        assert "iptables-legacy-save" in ran
        opened = [m.group(1) for l in lines if (m := re.search(r'open(?:at)?\([^"]*"([^"]+)"', l))]
        assert not [p for p in opened if p.startswith(("/build/", "/root/.pyenv", "/usr/local/lib/python"))], opened


PREV = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "@NETNS@"}], "ips": [{"address": "172.26.64.9/20"}]}


@pytest.mark.parametrize("flavour", ["legacy", "nft"])
def test_the_release_in_debian_11_without_python(tmp_path, flavour):
    """Extracted into /opt/cni/bin of a Debian 11 root that has no Python: it answers VERSION, records an ADD,
    and on DEL of the dead attachment removes the rules Debian 11's own iptables (1.8.7) holds for it."""
    arch = "amd64"
    release, bullseye = release_files(arch), bullseye_root(arch)
    host, container = unique("crt-h"), unique("crt-c")
    sh("ip", "netns", "add", host)
    sh("ip", "netns", "add", container)
    try:
        cid, ip = "3e803d29-4f9d-ad8b-adb6-31456a39db69", "172.26.64.9"
        nat, filt, _ = leak("nomad", cid, ip, 8080)
        (tmp_path / "rules").write_text(restore_text(nat, filt))
        conf = {"cniVersion": "1.0.0", "name": "nomad", "type": "cni-reaper", "capabilities": {"portMappings": True},
                "prevResult": json.loads(json.dumps(PREV).replace("@NETNS@", f"/run/netns/{container}"))}
        (tmp_path / "conf.json").write_text(json.dumps(conf))
        env = (f"export PATH=/tmp/bin:/usr/sbin:/usr/bin:/sbin:/bin CNI_CONTAINERID={cid} "
               f"CNI_NETNS=/run/netns/{container} CNI_IFNAME=eth0 CNI_PATH=/opt/cni/bin")
        setup = (f'mkdir -p "$ROOT/opt/cni/bin" "$ROOT/tmp/bin" && tar xzf {release["tgz"]} -C "$ROOT/opt/cni/bin" '
                 f'&& cp {tmp_path}/rules {tmp_path}/conf.json "$ROOT/tmp/" && in_root sh -ec "'
                 f"for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do "
                 f"ln -sf /usr/sbin/xtables-{flavour}-multi /tmp/bin/\\$t; done; {env}; "
                 f"! command -v python3 && ! ls /usr/bin/python* 2>/dev/null; "
                 f"CNI_COMMAND=VERSION /opt/cni/bin/cni-reaper; echo; "
                 f"CNI_COMMAND=ADD /opt/cni/bin/cni-reaper < /tmp/conf.json; echo; "
                 f'iptables-restore --noflush < /tmp/rules; iptables-save -t nat | grep -c {ip} || true"')
        first = debian11.in_overlay(bullseye, tmp_path / "ovl", setup, host_netns=host, arch=arch)
        assert first.returncode == 0, first.stdout + first.stderr
        out = first.stdout.splitlines()
        assert json.loads(out[0])["supportedVersions"][-1] == "1.1.0"
        assert json.loads(out[1])["ips"][0]["address"] == f"{ip}/20"
        assert int(out[2]) >= 2  # the masquerade jump and the DNAT rules are there
        sh("ip", "netns", "del", container)
        teardown = (f'in_root sh -ec "{env}; CNI_COMMAND=DEL /opt/cni/bin/cni-reaper < /tmp/conf.json; '
                    f'iptables-save; iptables-save -V"')
        second = debian11.in_overlay(bullseye, tmp_path / "ovl", teardown, host_netns=host, arch=arch)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "v1.8.7" in second.stdout and f"({'nf_tables' if flavour == 'nft' else 'legacy'})" in second.stdout
        assert ip not in second.stdout and cid not in second.stdout, second.stdout
        assert "CNI-HOSTPORT-DNAT" in second.stdout  # the shared chains stay
        backend = "python-iptables" if flavour == "legacy" else "iptables-nft-restore"
        assert f'"backend":"{backend}"' in second.stderr, second.stderr
    finally:
        sh("ip", "netns", "del", container, check=False)
        sh("ip", "netns", "del", host, check=False)


# what qemu-user (7.2, Debian 12) answers an arm64 program for netfilter, whichever flavour it speaks: it
# passes only the SOL_IP options it knows (not IPT_SO_GET_INFO, so libiptc, python-iptables and
# iptables-legacy get ENOPROTOOPT: "iptables who?"), and opens netlink sockets
# only of the protocols whose messages it translates (NETLINK_ROUTE, _KOBJECT_UEVENT, _AUDIT: nft,
# iptables-nft and conntrack get EPROTONOSUPPORT, "Protocol not supported")
QEMU_NETFILTER = {"legacy": "iptables who?", "nft": "Protocol not supported"}


@pytest.mark.parametrize("flavour", ["legacy", "nft"])
def test_the_arm64_release_in_debian_11_arm64_without_python_under_emulation(tmp_path, flavour):
    """Extracted into /opt/cni/bin of a Debian 11 arm64 root without Python, run under qemu-user with Debian
    11's arm64 iptables 1.8.7 on PATH: it answers VERSION and records an ADD. Its clean-up cannot reach
    netfilter there (QEMU_NETFILTER), so what is tested is what a plugin must do when netfilter fails: the
    dead attachment's DEL exits 0, says why in the log, leaves the rules (loaded and read here by the
    machine's own iptables, natively) and keeps the record for a later call."""
    arch = "arm64"
    release, bullseye = release_files(arch), bullseye_root(arch)
    host, container = unique("crt-h"), unique("crt-c")
    sh("ip", "netns", "add", host)
    sh("ip", "netns", "add", container)
    native = f"xtables-{flavour}-multi"
    try:
        cid, ip = "3e803d29-4f9d-ad8b-adb6-31456a39db69", "172.26.64.9"
        nat, filt, _ = leak("nomad", cid, ip, 8080)
        sh("ip", "netns", "exec", host, native, "iptables-restore", "--noflush", input=restore_text(nat, filt))
        def rules() -> list[str]:
            save = sh("ip", "netns", "exec", host, native, "iptables-save").stdout
            return [l for l in save.splitlines() if not l.startswith("#")]
        before = rules()
        assert sum(ip in l for l in before) >= 2
        conf = {"cniVersion": "1.0.0", "name": "nomad", "type": "cni-reaper", "capabilities": {"portMappings": True},
                "prevResult": json.loads(json.dumps(PREV).replace("@NETNS@", f"/run/netns/{container}"))}
        (tmp_path / "conf.json").write_text(json.dumps(conf))
        env = (f"export PATH=/tmp/bin:/usr/sbin:/usr/bin:/sbin:/bin CNI_CONTAINERID={cid} "
               f"CNI_NETNS=/run/netns/{container} CNI_IFNAME=eth0 CNI_PATH=/opt/cni/bin")
        setup = (f'mkdir -p "$ROOT/opt/cni/bin" "$ROOT/tmp/bin" && tar xzf {release["tgz"]} -C "$ROOT/opt/cni/bin" '
                 f'&& cp {tmp_path}/conf.json "$ROOT/tmp/" && in_root sh -ec "'
                 f"for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do "
                 f"ln -sf /usr/sbin/xtables-{flavour}-multi /tmp/bin/\\$t; done; {env}; "
                 f"! command -v python3 && ! ls /usr/bin/python* 2>/dev/null; uname -m; "
                 f"CNI_COMMAND=VERSION /opt/cni/bin/cni-reaper; echo; "
                 f'CNI_COMMAND=ADD /opt/cni/bin/cni-reaper < /tmp/conf.json; echo"')
        first = debian11.in_overlay(bullseye, tmp_path / "ovl", setup, host_netns=host, arch=arch)
        assert first.returncode == 0, first.stdout + first.stderr
        out = first.stdout.splitlines()
        assert out[0] == "aarch64"
        assert json.loads(out[1])["supportedVersions"][-1] == "1.1.0"
        assert json.loads(out[2])["ips"][0]["address"] == f"{ip}/20"
        state = tmp_path / "ovl" / "upper" / "var" / "lib" / "cni" / "reaper"
        [record] = [json.loads(p.read_text()) for p in state.glob("r-*.json")]
        assert record["containerID"] == cid and record["current"]["ips"][0]["address"] == ip
        sh("ip", "netns", "del", container)
        teardown = f'in_root sh -ec "{env}; CNI_COMMAND=DEL /opt/cni/bin/cni-reaper < /tmp/conf.json"'
        second = debian11.in_overlay(bullseye, tmp_path / "ovl", teardown, host_netns=host, arch=arch)
        assert second.returncode == 0, second.stdout + second.stderr  # never break the chain
        failed = [json.loads(l) for l in second.stderr.splitlines() if l.startswith("{")]
        assert any(l["msg"].startswith("clean-up failed") and QEMU_NETFILTER[flavour] in l.get("error", "")
                   for l in failed), second.stderr
        assert rules() == before
        assert [json.loads(p.read_text())["containerID"] for p in state.glob("r-*.json")] == [cid]  # kept for later
    finally:
        sh("ip", "netns", "del", container, check=False)
        sh("ip", "netns", "del", host, check=False)


@pytest.mark.parametrize("plugins_there", [False, True], ids=["no-opt-cni", "plugins-in-opt-cni-bin"])
def test_the_deb_installs_and_removes_exactly_its_files(tmp_path, release, bullseye, plugins_there, arch):
    """dpkg -i then dpkg -r in a throwaway Debian 11 root of the package's architecture (arm64's dpkg and
    maintainer scripts under emulation): afterwards only dpkg's own books, and the records and log cni-reaper
    wrote in between, differ from before; /opt stays (it belongs to no package) and so do /opt/cni/bin and
    the plugins in it when they were there before. The sweep's timer and service are installed in
    /lib/systemd/system, not enabled; enabled by the operator, the timer's link goes with the package."""
    before = "mkdir -p /opt/cni/bin && echo plugin > /opt/cni/bin/bridge; " if plugins_there else ""
    wants = "/etc/systemd/system/timers.target.wants"
    script = (f'cp {release["deb"]} "$ROOT/tmp/pkg.deb" && in_root sh -ec "'
              f"{before}dpkg -i /tmp/pkg.deb >/dev/null; "
              f"test -L /opt/cni/bin/cni-reaper; CNI_COMMAND=VERSION /opt/cni/bin/cni-reaper >/dev/null; "
              f"ls /usr/share/cni-reaper/conflist/1.1.0/nomad-reaper.conflist /usr/share/cni-reaper/nomad/client.hcl; "
              f"cmp /lib/systemd/system/cni-reaper-sweep.timer /tmp/shipped.timer; "
              f"cmp /lib/systemd/system/cni-reaper-sweep.service /tmp/shipped.service; "
              f"cmp -s /usr/share/cni-reaper/monitoring/cni-reaper.rules.yml /tmp/shipped.rules; "
              f"cmp -s /usr/share/cni-reaper/monitoring/cni-reaper-dashboard.json /tmp/shipped.dashboard; "
              f"! ls /etc/systemd/system/*.wants/cni-reaper-sweep.* 2>/dev/null; "  # installed, not enabled
              f"test \\\"\\$(readlink -f /usr/lib/cni-reaper/wrap/portmap)\\\" = /usr/lib/cni-reaper/cni-reaper; "
              # removal refused while a Nomad client's cni_path names the wrapper directory
              f"mkdir /etc/nomad.d && echo 'cni_path = \\\"/usr/lib/cni-reaper/wrap:/opt/cni/bin\\\"' > /etc/nomad.d/c.hcl; "
              f"! dpkg -r cni-reaper 2>/tmp/refused; grep -q 'take it out' /tmp/refused; "
              f"test -x /opt/cni/bin/cni-reaper; rm -r /etc/nomad.d /tmp/refused; "
              f"had=; [ ! -d {wants} ] || had=1; "
              f"mkdir -p {wants} && ln -s /lib/systemd/system/cni-reaper-sweep.timer {wants}/; "  # systemctl enable
              f"mkdir -p /var/lib/cni/reaper && echo x > /var/lib/cni/reaper/r-0.json && echo x > /var/log/cni-reaper.log; "
              f"dpkg -r cni-reaper >/dev/null; rm /tmp/pkg.deb /tmp/shipped.*; "
              f"[ -n \\\"\\$had\\\" ] || rmdir {wants}\"")  # fails if the link was left
    script = (f'cp {REPO}/conflist/systemd/cni-reaper-sweep.timer "$ROOT/tmp/shipped.timer" && '
              f'cp {REPO}/conflist/systemd/cni-reaper-sweep.service "$ROOT/tmp/shipped.service" && '
              f'cp {MONITORING}/cni-reaper.rules.yml "$ROOT/tmp/shipped.rules" && '
              f'cp {MONITORING}/cni-reaper-dashboard.json "$ROOT/tmp/shipped.dashboard" && {script}')
    proc = debian11.in_overlay(bullseye, tmp_path / "ovl", script, arch=arch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    upper = tmp_path / "ovl" / "upper"
    # a directory overlayfs only copied up (its times changed) is no change; a file, a whiteout (a removed
    # file) or a directory the base did not have is
    changed = sorted(str(p.relative_to(upper)) for p in upper.rglob("*")
                     if not p.is_dir() or not (bullseye / p.relative_to(upper)).is_dir())
    kept = [c for c in changed if not c.startswith(("var/lib/dpkg/", "var/log/dpkg.log", "var/cache/", "tmp", "run"))]
    there_before = ["opt/cni", "opt/cni/bin", "opt/cni/bin/bridge"] if plugins_there else []
    assert kept == [*there_before, "var/lib/cni", "var/lib/cni/reaper", "var/lib/cni/reaper/r-0.json",
                    "var/log/cni-reaper.log"], changed
