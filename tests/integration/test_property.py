"""A stateful property test with real concurrency: a seeded random walk over what a Nomad client and the
things beside it do, several at a time, through go-cni 1.1.13 (STATUS before every call, as Nomad 1.9.5+)
with the reference plugins 1.9 and cni-reaper chained last, in a small address range so that addresses are
reused. Steps: ADD of a new allocation, DEL, an allocation that dies without DEL, the late DEL of a dead one,
allocations made through the reference chain alone as before cni-reaper was installed (live ones, and the
classic leaks whose DEL succeeded: one deleted without its port mappings, one deleted after its netns was
removed; no record, no libcni cache entry; each a step of its own: no call of cni-reaper runs beside what
was done before it was installed), CHECK, the recreate after a failed CHECK (netns destroyed and made again at the same path, ADD, no DEL),
STATUS, `sweep --apply`, `sweep --apply --orphans` (with the network's conflist: host-local's word on the
leaks), GC (libcni 1.3's, with the live allocations as the valid
list), a reboot (every netns gone, host-local's directory emptied as a tmpfs is, the rules restored, a new
boot id; the step after it is one ADD, as below) and allocations restored at their old paths.

After every step: every live allocation's rules (every table, native nftables too) and reservation are
exactly what the reference plugins made for it; every ADD that the reference plugins alone would accept (a
free address in the range) succeeded, and every recreate succeeded; at the end, after one more sweep,
nothing of a dead allocation is left.

Both flavours' walks run at once, each in its own sandbox. CNI_REAPER_PROPERTY_STEPS (default 2000 per
flavour), CNI_REAPER_PROPERTY_SEED (printed on failure) and CNI_REAPER_PROPERTY_FLAVOURS to replay or to run
longer."""

from __future__ import annotations

import json
import os
import random
import re
import threading
from typing import Any, ClassVar

import pytest

from testkit.sandbox import Sandbox, Stack, open_sandbox, sh, unique

pytestmark = pytest.mark.netns
NET = "nomad-reaper"
STEPS = int(os.environ.get("CNI_REAPER_PROPERTY_STEPS", "2000"))
SEED = os.environ.get("CNI_REAPER_PROPERTY_SEED")
RANGE = [f"172.26.64.{i}" for i in range(10, 16)]  # six addresses
ADDRESS = re.compile(r"(\d+\.\d+\.\d+\.\d+)(?:/32|:\d+)")


class Alloc:
    def __init__(self, cid: str, netns: str, port: int) -> None:
        self.cid, self.netns, self.port = cid, netns, port
        self.ips: list[str] = []
        self.made: tuple | None = None  # its lines and reservations as the reference plugins made them

    @property
    def ports(self) -> tuple[str, ...]:
        return (f"{self.port}:80/tcp", f"{self.port}:80/udp")


class Walk:
    def __init__(self, sb: Sandbox, rng: random.Random, conflist, plain) -> None:
        self.sb, self.rng, self.conflist, self.plain = sb, rng, conflist, plain
        self.live: dict[str, Alloc] = {}
        self.dead: dict[str, Alloc] = {}  # died without DEL (or with the host): may get a late DEL, or be restored
        self.gone: dict[str, Alloc] = {}  # DEL'd: nothing of it may stay
        self.ports = iter(range(20000, 60000))
        self.failures: list[str] = []
        self.errors: list[str] = []  # what failed in the last step, allowed or not
        self.lock = threading.Lock()
        self.conf_dir = sb.root / "net.d"  # the network's conflist, as on the client: the CLI reads it
        self.booted = False  # a reboot was the last step

    # -- what the plugins made, and what is there now ---------------------------------------------------
    def lines(self, a: Alloc, tables: str | None = None) -> tuple[list[str], dict[str, str]]:
        lines = [l for l in self.sb.residue(NET, a.cid, a.ips, tables) if all(x in a.ips for x in ADDRESS.findall(l))]
        res = {ip: who for ip, who in self.sb.reservations(NET).items() if who == a.cid}
        return sorted(lines), res

    def well_formed(self, a: Alloc, lines: list[str], res: dict[str, str]) -> str | None:
        """Whether lines and reservations are what bridge, firewall and portmap make for one attachment."""
        [ip] = a.ips
        need = [f"-A POSTROUTING -s {ip}/32", f"-A CNI-FORWARD -s {ip}/32", f"-A CNI-FORWARD -d {ip}/32",
                f"--dports {a.port} ", f"--to-destination {ip}:80"]
        missing = [n for n in need if not any(n in l for l in lines)]
        if missing or res != {ip: a.cid}:
            return f"{a.cid} ({ip}): missing {missing}, reservations {res}"
        return None

    # -- steps --------------------------------------------------------------------------------------------
    def free(self) -> int:
        held = set(self.sb.reservations(NET))
        return len([ip for ip in RANGE if ip not in held])

    def _add(self, a: Alloc, expect: bool | None, what: str, conflist=None) -> bool:
        """ADD; `expect` True: it must succeed, None: the batch counts how many succeed."""
        proc = self.sb.driver("add", a.cid, a.netns, a.ports, conflist or self.conflist)
        if proc.returncode != 0:
            if expect:
                self.fail(f"{what} of {a.cid} failed though the plugins alone accept it: {proc.stderr[-400:]}\n"
                          f"cni-reaper's log of it, and its last lines:\n{self.log_of(a.cid)}")
            self.errors.append(f"{what} of {a.cid}: {proc.stderr[-300:]}")
            with self.lock:
                self.dead[a.cid] = a  # whatever its failed ADD or an earlier life left must go
            return False
        a.ips = [ip["address"].split("/")[0] for ip in json.loads(proc.stdout)[-1]["ips"]]
        with self.lock:
            self.live[a.cid] = a
        return True

    def add(self, done: list[bool]) -> None:
        done.append(self._add(Alloc(unique("alloc-"), self.sb.container(), next(self.ports)), None, "ADD"))

    def add_plain(self, done: list[bool]) -> None:
        """An allocation made before cni-reaper was installed: live, no record."""
        done.append(self._add(Alloc(unique("plain-"), self.sb.container(), next(self.ports)), None, "ADD (plain)",
                              self.plain))

    def leak_plain(self) -> None:
        """An allocation made and deleted before cni-reaper was installed, leaking the classic way (its DEL
        succeeded, so libcni keeps no entry): without its port mappings (#11901), or after its netns was
        removed (#6385)."""
        a = Alloc(unique("leak-"), self.sb.container(), next(self.ports))
        proc = self.sb.driver("add", a.cid, a.netns, a.ports, self.plain)
        if proc.returncode != 0:
            self.sb.remove_container(a.netns)  # no address free: nothing was made (the reference plugins' word)
            return
        a.ips = [ip["address"].split("/")[0] for ip in json.loads(proc.stdout)[-1]["ips"]]
        without_ports = self.rng.random() < 0.5
        if not without_ports:
            self.sb.remove_container(a.netns)
        proc = self.sb.driver("del", a.cid, a.netns, () if without_ports else a.ports, self.plain)
        if proc.returncode != 0:
            self.fail(f"the plain DEL of {a.cid} failed: {proc.stderr[-400:]}")
        if without_ports:
            self.sb.remove_container(a.netns)
        with self.lock:
            self.gone[a.cid] = a

    def delete(self, a: Alloc) -> None:
        proc = self.sb.driver("del", a.cid, a.netns, a.ports, self.conflist)
        if proc.returncode != 0:
            self.fail(f"DEL of {a.cid} failed: {proc.stderr[-400:]}")
        self.sb.remove_container(a.netns)
        with self.lock:
            self.gone[a.cid] = a

    def kill(self, a: Alloc) -> None:
        self.sb.remove_container(a.netns)
        with self.lock:
            self.dead[a.cid] = a

    def late_del(self, a: Alloc) -> None:
        proc = self.sb.driver("del", a.cid, a.netns, a.ports, self.conflist)
        if proc.returncode != 0:
            self.fail(f"the late DEL of {a.cid} failed: {proc.stderr[-400:]}")
        with self.lock:
            self.gone[a.cid] = a

    def check(self, a: Alloc) -> None:
        proc = self.sb.driver("check", a.cid, a.netns, a.ports, self.conflist)
        if proc.returncode != 0:
            self.fail(f"CHECK of live {a.cid} failed: {proc.stderr[-400:]}")
        with self.lock:
            self.live[a.cid] = a

    def recreate(self, a: Alloc, expect: bool) -> None:
        name = a.netns.rsplit("/", 1)[1]
        sh("ip", "netns", "del", name)
        sh("ip", "netns", "add", name)
        a.made, a.ips = None, []
        self._add(a, expect, "the recreate")

    def restore(self, a: Alloc, done: list[bool]) -> None:
        name = a.netns.rsplit("/", 1)[1]
        if os.path.exists(a.netns):  # an allocation whose ADD failed: its netns holds what bridge left, as Nomad's
            sh("ip", "netns", "del", name)  # does when its retries failed; it is destroyed with the allocation
        else:
            self.sb.containers.append(name)
        sh("ip", "netns", "add", name)
        a.made, a.ips = None, []
        done.append(self._add(a, None, "the restore"))

    def status(self) -> None:
        code, out, err = self.sb.status()
        if code != 0:
            self.fail(f"STATUS failed: {out} {err[-300:]}")

    def cli(self, *args: str) -> None:
        proc = self.sb.run([str(self.sb.plugin_dir / "cni-reaper"), *args, "--cni-conf-dir", str(self.conf_dir)])
        if proc.returncode not in (0, 6):
            self.fail(f"cni-reaper {' '.join(args)} exited {proc.returncode}: {proc.stdout[-300:]} {proc.stderr[-300:]}")

    def gc(self) -> None:
        proc = self.sb.driver("gc", conflist=self.conflist, valid=tuple(f"{c}:eth0" for c in sorted(self.live)))
        if proc.returncode != 0:
            self.fail(f"GC failed: {proc.stderr[-400:]}")
        with self.lock:  # libcni 1.3's GC sends a DEL for every cached attachment not in the valid list
            self.gone.update(self.dead)
            self.dead.clear()

    def reboot(self) -> None:
        self.booted = True
        self.sb.reboot(tmpfs_dirs=("networks",))
        self.dead.update(self.live)
        self.live.clear()

    def log_of(self, cid: str, last: int = 12) -> str:
        """The log's lines that name `cid` (the last `last`), then its last `last` lines: what to read first."""
        try:
            lines = self.sb.log_file.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join([*[l for l in lines if cid in l][-last:], "...", *lines[-last:]])

    def fail(self, why: str) -> None:
        with self.lock:
            self.failures.append(why)

    # -- one step: up to three of these at once -------------------------------------------------------------
    KINDS: ClassVar = ("add", "del", "kill", "late", "check", "recreate", "restore", "status", "sweep", "orphans",
                       "plain")
    WEIGHTS: ClassVar = (20, 8, 8, 5, 5, 5, 6, 6, 3, 5, 3)

    def step(self) -> list[str]:
        alone = self.rng.random()
        if alone < 0.01:
            return self.run([("reboot", self.reboot)])
        if alone < 0.03:  # the runtime's GC runs when none of its ADDs and DELs does (CNI spec)
            return self.run([("gc", self.gc)])
        batch = Batch(self)
        if self.booted:
            # the first step after a boot is one ADD: a boot empties host-local's directory, so the next ADD
            # may take a dead attachment's address before any cni-reaper call could make libcni's cache forget
            # it, and a late DEL of that attachment beside it (whose firewall plugin deletes the rules of every
            # cached address) is a race no plugin of the chain sees: the first ADD does (verbs/add.py)
            self.booted = False
            batch.add("add")
        elif alone < 0.06:  # made and deleted before installation: no call of cni-reaper runs beside it
            batch.add("leak")
        for _ in range(self.rng.choice([1, 2, 2, 3]) if not batch.jobs else 0):
            batch.add(self.rng.choices(self.KINDS, weights=self.WEIGHTS)[0])
        self.errors = []
        names = self.run(batch.jobs)
        batch.check()
        return names

    def run(self, jobs: list[tuple[str, Any]]) -> list[str]:
        def guarded(name: str, fn: Any) -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - the step is a failure of the walk, with its name
                self.fail(f"{name} raised {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=guarded, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [name for name, _ in jobs]

    def verify(self) -> None:
        tables = self.sb.tables()
        for a in sorted(self.live.values(), key=lambda a: a.cid):
            now = self.lines(a, tables)
            if a.made is None:
                bad = self.well_formed(a, *now)
                if bad:
                    self.fail(f"just made: {bad}")
                a.made = now
            elif now != a.made:
                lost = sorted(set(a.made[0]) - set(now[0]))
                self.fail(f"{a.cid} changed: lost {lost}, reservations {a.made[1]} -> {now[1]}")

    def leftovers(self) -> list[str]:
        tables = self.sb.tables()
        held = {ip for a in self.live.values() for ip in a.ips}
        out = []
        for a in [*self.dead.values(), *self.gone.values()]:
            dead_ips = [ip for ip in a.ips if ip not in held]
            out += [f"{a.cid}: {l}" for l in self.sb.residue(NET, a.cid, dead_ips, tables)
                    if a.cid in l or any(f"{ip}/" in l for ip in dead_ips)]
        return out


class Batch:
    """The jobs of one step, on allocations no other job of the step touches. What the reference plugins alone
    would accept: with F addresses free when the step starts and N ADDs (new or restored) in it, at least
    min(F, N) of them succeed, whichever; a recreate releases its old address before it takes one, and must
    succeed when the ADDs of its step leave it one."""

    def __init__(self, walk: Walk) -> None:
        self.w = walk
        self.busy: set[str] = set()
        self.jobs: list[tuple[str, Any]] = []
        self.free = walk.free()
        self.done: list[bool] = []  # each ADD's outcome
        self.adds = 0
        self.recreates: list[Alloc] = []

    def check(self) -> None:
        need = min(self.free, self.adds)
        if sum(self.done) < need:
            self.w.fail(f"{sum(self.done)} of {self.adds} ADDs succeeded with {self.free} addresses free: "
                        + "; ".join(self.w.errors))

    def pick(self, pool: dict[str, Alloc]) -> Alloc | None:
        with self.w.lock:
            free = [a for c, a in sorted(pool.items()) if c not in self.busy]
            if not free:
                return None
            a = self.w.rng.choice(free)
            self.busy.add(a.cid)
            pool.pop(a.cid)
            return a

    def add(self, kind: str) -> None:
        w = self.w
        if kind == "add" and len(w.live) + len(self.busy) < len(RANGE) - 1:
            self.jobs.append(("add", lambda: w.add(self.done)))
            self.adds += 1
        elif kind in ("del", "kill", "check", "recreate"):
            self._on_live(kind)
        elif kind in ("late", "restore"):
            self._on_dead(kind)
        elif kind == "status":
            self.jobs.append(("STATUS", w.status))
        elif kind == "sweep":
            self.jobs.append(("sweep --apply", lambda: w.cli("sweep", "--apply")))
        elif kind == "orphans":
            self.jobs.append(("sweep --apply --orphans", lambda: w.cli("sweep", "--apply", "--orphans")))
        elif kind == "plain" and len(w.live) + len(self.busy) < len(RANGE) - 1:
            self.jobs.append(("ADD (plain)", lambda: w.add_plain(self.done)))
            self.adds += 1
        elif kind == "leak" and len(w.live) + len(self.busy) < len(RANGE) - 1:
            self.free -= 1  # it holds an address while it is made: the step's ADDs may not have it
            self.jobs.append(("a leak from before installation", w.leak_plain))

    def _on_live(self, kind: str) -> None:
        a = self.pick(self.w.live)
        if a is None:
            return
        if kind == "recreate" and a.cid.startswith("plain-"):
            # not for one made before installation: nothing recorded its namespace, so its old life cannot be
            # told from the new one at the same path (libcni's cache names only the path); host-local refuses
            # the new ADD (its old reservation stands), with or without cni-reaper
            kind = "check"
        if kind == "recreate":  # decided once the step's ADDs are known
            self.jobs.append((f"recreate {a.cid}", lambda a=a: self.w.recreate(a, self.free > self.adds)))
            return
        fn = {"del": self.w.delete, "kill": self.w.kill, "check": self.w.check}[kind]
        self.jobs.append((f"{kind} {a.cid}", lambda fn=fn, a=a: fn(a)))

    def _on_dead(self, kind: str) -> None:
        a = self.pick(self.w.dead)
        if a is None:
            return
        if a.cid.startswith("plain-"):  # made before installation: its old reservation stands until its DEL or an
            kind = "late"  # orphan sweep, so host-local refuses it at its old path (with or without cni-reaper)
        if kind == "late":
            self.jobs.append((f"late DEL {a.cid}", lambda: self.w.late_del(a)))
        else:
            self.jobs.append((f"restore {a.cid}", lambda: self.w.restore(a, self.done)))
            self.adds += 1


NOMAD = Stack("1.9", "go-cni-1.1.13")
FLAVOURS = [f for f in os.environ.get("CNI_REAPER_PROPERTY_FLAVOURS", "nft,legacy").split(",") if f]


def _walk(sb: Sandbox, flavour: str, seed: int) -> str | None:
    """One seeded walk of STEPS steps in sandbox `sb`; what went wrong (with the line that replays it), or None."""
    rng = random.Random(seed)
    conflist = sb.conflist()
    data = json.loads(conflist.read_text())
    for p in data["plugins"]:
        if p["type"] == "bridge":
            p["ipam"]["ranges"] = [[{"subnet": "172.26.64.0/20", "rangeStart": RANGE[0], "rangeEnd": RANGE[-1]}]]
    conflist.write_text(json.dumps(data))
    data["plugins"] = [p for p in data["plugins"] if p["type"] != "cni-reaper"]
    plain = sb.root / "plain.conflist"
    plain.write_text(json.dumps(data))
    walk = Walk(sb, rng, conflist, plain)
    walk.conf_dir.mkdir()
    (walk.conf_dir / "10-nomad.conflist").write_text(conflist.read_text())
    history: list[str] = []
    replay = (f"replay: CNI_REAPER_PROPERTY_SEED={seed} CNI_REAPER_PROPERTY_STEPS={STEPS} "
              f"CNI_REAPER_PROPERTY_FLAVOURS={flavour}")
    n = 0
    # a walk that ends on a boot takes the step after it (one ADD): until that ADD makes host-local's directory
    # again, nothing proves dead the leaks the boot's restore brought back
    while n < STEPS or walk.booted:
        history.append(f"{n}: " + ", ".join(walk.step()))
        walk.verify()
        if walk.failures:
            return f"{replay}\n" + "\n".join(walk.failures[:5]) + "\nlast steps:\n" + "\n".join(history[-8:])
        n += 1
    walk.cli("sweep", "--apply", "--orphans")
    walk.status()
    if walk.leftovers() != []:
        return f"{replay}: at quiescence something of a dead allocation is left: {walk.leftovers()[:5]}"
    print(f"{replay}: {STEPS} steps, {len(walk.live)} live, {len(walk.dead)} dead, {len(walk.gone)} deleted")
    return None


def test_any_interleaving_keeps_live_attachments_whole_and_leaves_nothing_of_dead_ones(tmp_path, package_exe):
    """Each iptables flavour's walk in its own sandbox, both at once (a walk keeps about one core busy)."""
    from testkit.sandbox import driver_for

    seeds = {f: int(SEED) if SEED else random.SystemRandom().randrange(2**32) for f in FLAVOURS}
    driver_for(NOMAD.runtime)  # built once, before the walks start
    outcome: dict[str, str | None] = {}

    def run(flavour: str) -> None:
        try:
            with open_sandbox(tmp_path / flavour, flavour, package_exe, NOMAD) as sb:
                outcome[flavour] = _walk(sb, flavour, seeds[flavour])
        except BaseException as exc:  # noqa: BLE001 - reported with its seed below
            outcome[flavour] = (f"replay: CNI_REAPER_PROPERTY_SEED={seeds[flavour]} CNI_REAPER_PROPERTY_FLAVOURS="
                                f"{flavour}: {type(exc).__name__}: {exc}")

    walks = [threading.Thread(target=run, args=(f,), name=f"walk-{f}") for f in FLAVOURS]
    for t in walks:
        t.start()
    for t in walks:
        t.join()
    failed = [outcome.get(f, f"{f}: no outcome") for f in FLAVOURS if outcome.get(f, "x") is not None]
    assert not failed, "\n\n".join(m or "" for m in failed)
