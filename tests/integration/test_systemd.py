"""The operator's install end to end under a real systemd (issue 35; issue 32's seventh case): a Debian 12
machine booted by systemd 252 in a container (testkit/booted.py: its own network namespace, every change in
a tmpfs), the amd64 .deb installed with dpkg, the reference plugins from Debian's packages, the timer enabled
as the README says, allocations made through go-cni inside it. The timer's sandboxed service removes what a
dead allocation left, writes its log and metrics, and keeps every line and the reservation of a live one:
that allocation was recorded with the container's own boot ID, which the service, whose
ProtectKernelTunables= remounts /proc/sys, reads from another view (not evidence of a reboot)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from testkit.booted import CannotBoot, Machine, root
from testkit.sandbox import build_driver

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.release]

CONFLIST = "/opt/cni/config/nomad-reaper.conflist"
PLUGINS = "/usr/lib/cni:/opt/cni/bin"
RESERVATIONS = "/var/lib/cni/networks/nomad-reaper"


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    from integration.test_release import release_files

    deb = release_files("amd64")["deb"]
    if not shutil.which("debootstrap"):
        pytest.fail("debootstrap is not installed: run scripts/setup.sh")
    try:
        lower = root()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    driver = build_driver("go-cni-1.1.7")
    log = tmp_path_factory.mktemp("booted") / "console.log"
    try:
        m = Machine(lower, {str(deb): "/mnt/cni-reaper.deb", driver: "/usr/local/bin/reaperdriver"}, log)
    except CannotBoot as exc:
        pytest.skip(f"this machine cannot boot a container: {exc}")
    try:
        yield m
    finally:
        m.stop()


def driver(op: str, cid: str, *ports: str) -> str:
    flags = " ".join(f"-port {p}" for p in ports)
    return f"reaperdriver -conflist {CONFLIST} -plugindir {PLUGINS} -op {op} -id {cid} -netns /var/run/netns/{cid} {flags}"


def mine(m: Machine, cid: str) -> list[str]:
    """Every line of both families' tables that names the allocation (its chains are named by hashes of
    its ID: those lines carry its ID in their comments, as do its jumps)."""
    return [l for l in m.run("iptables-save; ip6tables-save").stdout.splitlines() if cid in l]


def test_the_timers_service_removes_a_dead_allocations_leftovers_and_keeps_a_live_ones(machine):
    m = machine
    m.run("dpkg -i /mnt/cni-reaper.deb >/dev/null && mkdir -p /opt/cni/config /var/lib/prometheus/node-exporter"
          f" && cp /usr/share/cni-reaper/conflist/nomad-reaper.conflist {CONFLIST}"
          " && systemctl enable --now cni-reaper-sweep.timer")
    assert "cni-reaper-sweep.timer" in m.run("systemctl list-timers --all --no-legend").stdout
    m.run(f"ip netns add live-alloc && {driver('add', 'live-alloc', '8080:80/tcp')} >/dev/null")
    m.run(f"ip netns add dead-alloc && {driver('add', 'dead-alloc', '8081:80/tcp', '8081:80/udp')} >/dev/null"
          " && ip netns del dead-alloc")  # the allocation dies with no DEL (a client that was down)
    live, dead = mine(m, "live-alloc"), mine(m, "dead-alloc")
    assert live and dead
    reserved = m.run(f"grep -l . {RESERVATIONS}/1*").stdout.split()
    held = {p: m.run(f"head -1 {p}").stdout.strip() for p in reserved}
    assert sorted(held.values()) == ["dead-alloc", "live-alloc"], held
    booted = m.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert booted not in Path("/proc/sys/kernel/random/boot_id").read_text(), "the container has the machine's boot ID"

    ran = m.run("systemctl start cni-reaper-sweep.service; systemctl show -p Result -p ExecMainStatus "
                "cni-reaper-sweep.service", check=False)
    journal = m.run("journalctl -u cni-reaper-sweep.service --no-pager -o cat").stdout
    assert "Result=success" in ran.stdout and "ExecMainStatus=0" in ran.stdout, ran.stdout + ran.stderr + journal
    assert mine(m, "dead-alloc") == [], journal
    assert mine(m, "live-alloc") == live, "the periodic sweep changed a live allocation's rules"
    now = {p: m.run(f"head -1 {p}", check=False).stdout.strip() for p in reserved}
    assert {p: c for p, c in now.items() if c} == {p: c for p, c in held.items() if c == "live-alloc"}
    assert "dead-alloc" in journal, journal
    assert "dead-alloc" in m.run("cat /var/log/cni-reaper.log").stdout
    metrics = m.run("cat /var/lib/prometheus/node-exporter/cni_reaper.prom").stdout
    assert "cni_reaper_" in metrics
    refused = m.run("journalctl --no-pager -o cat | grep -i -e 'cni-reaper-sweep.service.*\\(failed\\|ignoring\\)' "
                    "|| true").stdout
    assert refused == "", refused  # every directive of the unit applied (none refused in the container)


def test_the_package_goes_with_its_timer(machine):
    m = machine
    m.run("dpkg -s cni-reaper >/dev/null 2>&1 || dpkg -i /mnt/cni-reaper.deb >/dev/null;"
          " systemctl enable cni-reaper-sweep.timer 2>/dev/null; dpkg -r cni-reaper >/dev/null")
    assert m.run("systemctl is-enabled cni-reaper-sweep.timer", check=False).returncode != 0
    assert m.run("ls /etc/systemd/system/timers.target.wants/ 2>/dev/null").stdout.count("cni-reaper") == 0
    assert m.run("test -e /opt/cni/bin/cni-reaper", check=False).returncode != 0
