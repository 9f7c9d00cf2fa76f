"""`cni-reaper undo CONTAINER_ID` (through reap/engine.py): put back what clean-ups removed for that container,
as the journal says it was (state/journal.py): iptables rules at their positions in their chains, in the
flavour and family they were in; chains with their rules; native nftables rules; host-local reservation
files with their content;
libcni's cached result as it was; the record. What something live now holds is never put back, and undo
says what stands in the way:

- an address another attachment or a recorded newer life of the container now holds (a record that is not
  dead, a reservation naming another container): none of the rules or the reservation of that address;
  nothing that names an address of a network no host-local reservation governs here (static, dhcp: its
  holders cannot be seen), nor after host-local made a network directory while undo looked;
- a host port another rule now maps (in CNI-HOSTPORT-DNAT, or the native hostports chains): not the jump
  that would shadow it;
- a chain that exists again (a newer life of the container): not the chain, nor a jump into it;
- a cached result libcni rewrote since (a newer life), or no longer has (its DEL ran): not that;
- a record of the same attachment: not the record.
Conntrack entries cannot be put back (the journal says they were cleared). What an undo put back is journaled
too: a second undo finds nothing to do.
"""

from __future__ import annotations

import os

from cni_reaper.cni.ipaddr import parse_ip
from cni_reaper.files import open_regular
from cni_reaper.reap.netfilter.iptables.rules import Op, insert_op, new_chain_op
from cni_reaper.reap.netfilter.nftables.rules import NativeOp, adding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.reap.claims import Others
    from cni_reaper.reap.holders import PortMap
    from cni_reaper.state.journal import Removed
    from cni_reaper.state.store import Store

class Report:
    def __init__(self) -> None:
        self.restored: list[tuple[Removed, str]] = []
        self.refused: list[tuple[Removed, str]] = []
        self.gone: list[tuple[Removed, str]] = []  # can never be put back (not asked again)
        self.unrestorable: list[Removed] = []

    def ok(self, e: Removed, what: str) -> None:
        self.restored.append((e, what))

    def no(self, e: Removed, why: str) -> None:
        self.refused.append((e, why))

    def failed(self, entries: list[Removed], why: str) -> None:
        """What was to be put back in a transaction that failed: none of it is back."""
        ids = {id(e) for e in entries}
        for e, _ in [(e, w) for e, w in self.restored if id(e) in ids]:
            self.no(e, why)
        self.restored = [(e, w) for e, w in self.restored if id(e) not in ids]


def pending(store: Store, cid: str) -> list[Removed]:
    from cni_reaper.state import journal

    return [e for e in journal.items(store, cid) if not e.restored]


# what a journaled rule that matches no address (or, mapping host ports, no port) is: the plugins make none such,
# so its journal entry is damaged, and put back it would catch every packet
BROADER = "it names no address or host port the plugins' rules name (a damaged journal entry?): not put back"
LOCK_TIMEOUT = 10.0  # seconds for each of host-local's locks (as the CLI's lockTimeout by default)


def undo(store: Store, cid: str, dry_run: bool, data_dirs: list[str], confs: dict[str, Any] | None = None,
         cache_dir: str = "/var/lib/cni") -> Report:
    """Put back what the journal says was removed for `cid` (the caller holds the state lock). `confs` (network ->
    its configuration) and `cache_dir`: what the records are judged with, as `list` and the sweep judge them."""
    from cni_reaper.reap.claims import Holdings
    from cni_reaper.reap.evidence import View
    from cni_reaper.reap.hostlocal import locked_dirs, networks_in
    from cni_reaper.reap.sweep import holdings
    from cni_reaper.state.journal import Journal

    report = Report()
    entries = pending(store, cid)
    if not entries:
        return report
    dirs = _data_dirs(store, data_dirs, entries)
    # no address is given or taken on these networks from the look at who holds what to the last put-back
    # (host-local's locks, after the state lock, in the one order every clean-up takes them)
    with locked_dirs({(d, n) for d in dirs for n in networks_in(d)}, LOCK_TIMEOUT) as held:
        now = Holdings(holdings(store.records(), View(), confs or {}, cache_dir), held.values())
        _put_back(store, entries, now.others_than(cid), report, dry_run, held, dirs)
    if not dry_run:
        Journal(store).undone(f"undo-{cid}", [[e.event, e.index] for e, _ in report.restored],
                              [[e.event, e.index, why] for e, why in report.refused],
                              [[e.event, e.index, why] for e, why in report.gone] + [[e.event, e.index] for e in
                                                                                      report.unrestorable])
    return report


def _data_dirs(store: Store, given: list[str], entries: list[Removed]) -> list[str]:
    """Every directory host-local may keep a reservation of these networks in: the ones given (the conflists'),
    host-local's default and Nomad 1.9.4+'s (/var/run/cni), those the records and the journal name."""
    from cni_reaper.cni.conf import DEFAULT_IPAM_DIRS

    named = [e.item["dataDir"] for e in entries if damaged(e.item) is None and "dataDir" in e.item]
    for r in store.records():
        named += [ip.reservation.data_dir for life in r.lives for ip in life.ips if ip.reservation is not None]
        named += [r.settings.ipam_data_dir] if r.settings else []
    return list(dict.fromkeys([*given, *DEFAULT_IPAM_DIRS, *named]))


TIED = ("iptables", "nft", "cache")  # the kinds of item that name an address (a reservation is host-local's own)


def _put_back(store: Store, entries: list[Removed], holders: Others, report: Report, dry_run: bool,
              held: dict[Any, Any], dirs: list[str]) -> None:
    """Each sound journal item put back as its kind is (or refused, with the reason), against `holders` and
    the host ports every world maps now; `held`: host-local's directories locked at the look, of `dirs`."""
    from cni_reaper.reap.holders import PortMap, port_map

    kinds = _sound(entries, holders, report)
    report.unrestorable = kinds.pop("conntrack", []) + kinds.pop("netns", [])
    _reservations(kinds.get("reservation", []), holders, report, dry_run, held)
    ports = port_map() if kinds.get("iptables") or kinds.get("nft") else PortMap()
    _unless_made_since(kinds, held, dirs, report)
    _iptables(kinds.get("iptables", []), holders, ports, report, dry_run)
    _native(kinds.get("nft", []), holders, ports, report, dry_run)
    _cache(kinds.get("cache", []), holders, report, dry_run)
    _record(store, kinds.get("record", []), holders, report, dry_run)


def _sound(entries: list[Removed], holders: Others, report: Report) -> dict[str, list[Removed]]:
    """The items that may be put back, by kind; a damaged one, or one naming an address of a network no
    host-local reservation governs here, is refused."""
    kinds: dict[str, list[Removed]] = {}
    for e in entries:
        damage = damaged(e.item)
        unseen = holders.ungoverned(e.item["key"][0]) if not damage and e.item.get("kind") in TIED else None
        if damage or unseen:
            report.no(e, f"its journal entry is damaged ({damage}): not put back" if damage else unseen or "")
        else:
            kinds.setdefault(e.item.get("kind", ""), []).append(e)
    return kinds


def _unless_made_since(kinds: dict[str, list[Removed]], held: dict[Any, Any], dirs: list[str], report: Report) -> None:
    """None of the items that name an address, when host-local made a network directory since the look (who
    holds its addresses was not read; another undo reads it)."""
    from cni_reaper.reap.hostlocal import networks_in

    made = sorted(f"{d}/{n}" for d in dirs for n in networks_in(d) if (d, n) not in held)
    for e in [e for kind in TIED for e in kinds.pop(kind, [])] if made else []:
        report.no(e, f"host-local made {made[0]} while undo looked: its reservations were not read (run undo again)")


def damaged(item: dict[str, Any]) -> str | None:
    """What is wrong with a journaled item (None: nothing), as the journal item's model says (models.py, the one
    declaration of the journal's items): a damaged journal puts nothing back of it, and never half of an item."""
    from cni_reaper.models import journal_item_problem

    return journal_item_problem(item)


# -- reservations -----------------------------------------------------------------------------------
def _reservations(entries: list[Removed], holders: Others, report: Report, dry_run: bool,
                  locked: dict[Any, Any]) -> None:
    """`locked`: host-local's directories locked for the whole undo, by (data dir, network)."""
    from cni_reaper.reap.hostlocal import NetworkDir

    written: set[tuple[str, str, str]] = set()  # (data dir, network, address) put back by this undo
    for e in entries:
        it = e.item
        path = os.path.join(it["dataDir"], it["network"])
        d: Any = locked.get((it["dataDir"], it["network"]))
        fresh = d is None or d.fd is None  # not there at the look (host-local makes it at its first ADD)
        if fresh and dry_run and not os.path.isdir(path):  # nothing reserved there: judged as the undo would be
            _reservation(e, None, holders, report, dry_run, written)
            continue
        if fresh:
            os.makedirs(path, mode=0o755, exist_ok=True)
            d = NetworkDir(it["dataDir"], it["network"])
        try:
            _reservation(e, d, holders, report, dry_run, written)
        finally:
            if fresh:
                d.close()


def _reservation(e: Removed, d: Any, holders: Others, report: Report, dry_run: bool,
                 written: set[tuple[str, str, str]]) -> None:
    """One journaled reservation put back in its network's directory `d` (or refused, with the reason; `d` None:
    a dry run's, of a directory host-local has not made yet)."""
    it = e.item
    where = (it["dataDir"], it["network"], it["ip"])
    now = None if d is None else d.get(it["ip"])
    if now is not None:  # journaled twice and put back above, by an undo cut short, or reserved again
        if where in written or now.content == it["content"]:
            report.ok(e, "already back")
        else:
            report.no(e, f"{it['ip']} is reserved by {now.owner[0]} now")
        return
    held = holders.of({parse_ip(it["ip"])[1]})
    if held:
        report.no(e, held)
        return
    written.add(where)
    try:
        if not dry_run:
            _write_reservation(d, it)
    except OSError as exc:  # something not host-local's at its name (a directory, a symlink)
        report.no(e, f"{it['ip']} cannot be written in {it['dataDir']}/{it['network']}: {exc.strerror}")
        return
    report.ok(e, f"host-local reservation {it['network']}/{it['ip']}")


def _write_reservation(d: Any, it: dict[str, Any]) -> None:
    with d.locked(10):
        fd = open_regular(it["ip"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, it.get("mode", 0o600), dir_fd=d.fd)
        try:
            os.write(fd, it["content"].encode())
            if it.get("mtime") is not None:  # as host-local made it: the record put back knows it by that time
                os.utime(fd, ns=(it["mtime"], it["mtime"]))
        finally:
            os.close(fd)


# -- iptables ------------------------------------------------------------------------------------------
def _iptables(entries: list[Removed], holders: Others, ports: PortMap, report: Report, dry_run: bool) -> None:
    groups: dict[tuple[int, str], list[Removed]] = {}
    for e in entries:
        groups.setdefault((e.item["family"], e.item["flavour"]), []).append(e)
    for (family, flavour), group in sorted(groups.items()):
        _iptables_family(family, flavour, group, _Checks(holders, ports), report, dry_run)


class _Checks:
    """What a put-back is checked against: who holds addresses, and who maps host ports in every world."""

    def __init__(self, holders: Others, ports: PortMap) -> None:
        self.holders, self.ports = holders, ports


def _iptables_family(family: int, flavour: str, entries: list[Removed], checks: _Checks, report: Report,
                     dry_run: bool) -> None:
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.select import backend_of

    try:
        backend = backend_of(flavour, family)
        tables = backend.read(family)
    except BackendError as exc:
        for e in entries:
            report.no(e, f"ipv{family} {flavour} tables cannot be read: {exc}")
        return
    plan = _IptablesPlan(tables, checks)
    plan.plan(entries, report)
    if plan.ops and not dry_run:
        try:
            backend.apply(family, plan.ops)  # the clean-up's backend: a put-back is a plan applied
        except BackendError as exc:
            report.failed(plan.entries, f"ipv{family} {flavour} put-back failed: {exc}")


class _IptablesPlan:
    """The operations that put the items back (iptables.rules PUT_BACKS), checked against the tables as they
    are now."""

    def __init__(self, tables: dict[str, Any], checks: _Checks) -> None:
        self.tables, self.holders, self.ports = tables, checks.holders, checks.ports
        self.ops: list[Op] = []
        self.candidates: set[tuple[str, str]] = set()  # chains that may come back (if a jump to them does)
        self.removed: dict[tuple[str, str], set[str]] = {}  # chains the clean-ups removed, with their rules
        self.jumped: set[tuple[str, str]] = set()  # chains a rule put back jumps to
        self.inserted: dict[tuple[str, str], int] = {}
        self.entries: list[Removed] = []
        self.taken: set[tuple[str, str, str, Any]] = set()  # (table, chain, op, spec) of what is put back

    def plan(self, entries: list[Removed], report: Report) -> None:
        """Take each item that may be put back: the rules in their positions' order, then the chains (a chain
        comes back with a jump to it, never alone)."""
        chains = [e for e in entries if e.item["op"] == "chain"]
        rules = sorted((e for e in entries if e.item["op"] != "chain"), key=lambda e: e.item.get("index", 0))
        self.removed = {(e.item["table"], e.item["chain"]): set(e.item["rules"]) for e in chains}
        self.candidates = {(e.item["table"], e.item["chain"]) for e in chains if self.chain_ok(e) is None}
        for e in rules + chains:
            self.take(e, report)

    def _exists(self, table: str, chain: str) -> bool:
        t = self.tables.get(table)
        return (t is not None and chain in t.chains) or (table, chain) in self.candidates

    def chain_ok(self, e: Removed) -> str | None:
        it = e.item
        t = self.tables.get(it["table"])
        if t is not None and it["chain"] in t.chains:
            return f"{it['table']} {it['chain']} exists (a newer life of the container has it)"
        return next((why for why in (self._held(it["chain"], spec) for spec in it["rules"]) if why), None)

    def _held(self, chain: str, spec: str) -> str | None:
        from cni_reaper.reap.holders import rule_addresses
        from cni_reaper.reap.netfilter.iptables.rules import parse_rule

        return self.holders.of(rule_addresses(parse_rule(chain, spec)))

    def take(self, e: Removed, report: Report) -> None:
        it = e.item
        table, chain = it["table"], it["chain"]
        again = (table, chain, it["op"], it.get("spec"))
        if again in self.taken:  # journaled twice (a clean-up killed between its intent and its rules, then
            self.entries.append(e)  # the next one's): put back once, and both items are settled
            report.ok(e, f"ipv{it['family']} {table} {chain}: {it.get('what', '')} (with another journal item)")
            return
        if it["op"] == "chain":
            why = self.chain_ok(e) or (None if (table, chain) in self.jumped else "no jump to it can be put back")
            if why:
                report.no(e, why)
                return
            self.taken.add(again)
            owner, what = _owner(it), it.get("what", "")
            self.ops.append(new_chain_op(table, chain, owner, what))
            self.ops += [insert_op(table, chain, spec, -1, owner, what) for spec in it["rules"]]
        else:
            why = self._conflict(table, chain, it["spec"])
            if why:
                report.no(e, why)
                return
            target = _target(chain, it["spec"])
            if target:
                self.jumped.add((table, target))
            length = len(self.tables[table].chains.get(chain, [])) + self.inserted.get((table, chain), 0)
            pos = min(it.get("index", 0), length)  # its position then, the others being as they were
            self.inserted[(table, chain)] = self.inserted.get((table, chain), 0) + 1
            self.taken.add(again)
            self.ops.append(insert_op(table, chain, it["spec"], pos, _owner(it), it.get("what", "")))
        self.entries.append(e)
        report.ok(e, f"ipv{it['family']} {table} {chain}: {it.get('what', '')}")

    def _made_again(self, table: str, chain: str) -> bool:
        """Whether `chain`, which a clean-up removed, is there again, but not as it was removed (as an undo cut
        short puts it back): a newer life of the container made it."""
        t = self.tables.get(table)
        return ((table, chain) in self.removed and (table, chain) not in self.candidates and t is not None
                and {r.spec for r in t.chains.get(chain, [])} != self.removed[(table, chain)])

    def _conflict(self, table: str, chain: str, spec: str) -> str | None:
        """Why a rule may not be put back: its chain or target is not there, an address it names is held by
        another attachment (untagged rules of it, firewall's, are that attachment's now, whatever they look
        like), it is there already, or it maps a host port another container maps now."""
        from cni_reaper.reap.holders import IPTABLES, IPTABLES_DNAT_CHAIN, iptables_owner, rule_addresses, rule_ports
        from cni_reaper.reap.netfilter.iptables.rules import parse_rule

        t = self.tables.get(table)
        if t is None or chain not in t.chains:
            return f"{table} {chain} is not there"
        held = self._held(chain, spec)
        if held:
            return held
        if any(r.spec == spec for r in t.chains[chain]):
            return "already there"
        rule = parse_rule(chain, spec)
        why = self._target_conflict(table, rule.target) if rule.target else None
        if why:
            return why
        if chain == IPTABLES_DNAT_CHAIN:
            ports = rule_ports(rule)
            if not ports:
                return BROADER
            owner = iptables_owner(rule.comment)
            shadows = (self.ports.shadowed(ports, owner, to, IPTABLES) for to in self._sends_to(table, rule.target))
            return next(filter(None, shadows), None)
        return None if rule_addresses(rule) else BROADER

    def _sends_to(self, table: str, chain: str | None) -> list[str]:
        """The addresses a put-back jump to `chain` (a container's CNI-DN chain) sends its ports to: the chain's
        DNAT targets as the clean-up removed it, or as it is when it was not removed ([""]: not known), so
        that a newer life of the container mapping the port elsewhere, in either world, is told apart."""
        from cni_reaper.reap.holders import dnat_targets
        from cni_reaper.reap.netfilter.iptables.rules import parse_rule

        chain = chain or ""
        specs = self.removed.get((table, chain))
        if specs is not None:
            rules = [parse_rule(chain, spec) for spec in specs]
        else:
            t = self.tables.get(table)
            rules = t.chains.get(chain, []) if t is not None else []
        return dnat_targets(rules) or [""]


    def _target_conflict(self, table: str, target: str) -> str | None:
        """Why a rule jumping to `target` may not be put back: the chain of ours it jumps to is not there and
        does not come back with it, or a newer life of the container made it again."""
        if target.startswith("CNI-") and not self._exists(table, target):
            return f"its target chain {target} is not there"
        if self._made_again(table, target):
            return f"its target chain {target} exists again (a newer life of the container has it)"
        return None


def _owner(item: dict[str, Any]) -> tuple[str, str]:
    """(network, container ID) of a journaled item (its key: network, container ID, ifname)."""
    key = item.get("key")
    return (str(key[0]), str(key[1])) if isinstance(key, list) and len(key) == 3 else ("", "")


def _target(chain: str, spec: str) -> str | None:
    from cni_reaper.reap.netfilter.iptables.rules import parse_rule

    return parse_rule(chain, spec).target


# -- native nftables, libcni's cache, the record -----------------------------------------------------------
def _native(entries: list[Removed], holders: Others, ports: PortMap, report: Report, dry_run: bool) -> None:
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend

    if not entries:
        return
    nft = NftBackend()
    try:
        present = nft.read()
    except BackendError as exc:
        for e in entries:
            report.no(e, f"the native tables cannot be read: {exc}")
        return
    now = {_native_key(r.raw or {}) for r in present}
    adds, ok = [], []
    for e in entries:
        rule = e.item["rule"]
        verdict, why = _native_verdict(rule, holders, ports, now)
        if verdict == "add":
            adds.append(adding(rule, _owner(e.item), e.item.get("what", "")))
            ok.append(e)
            now.add(_native_key(rule))  # journaled twice: put back once
            report.ok(e, f"nft {e.item['family']} {e.item['table']} {e.item['chain']}: {e.item.get('what', '')}")
        else:
            (report.ok if verdict == "there" else report.no)(e, why)
    if adds and not dry_run:
        _add_native(nft, adds, ok, report)


def _add_native(nft: Any, adds: list[NativeOp], entries: list[Removed], report: Report) -> None:
    """Add the rules in one transaction, through the clean-up's backend; when it fails, none of `entries` was
    put back, and the report says so."""
    from cni_reaper.reap.netfilter.interface import BackendError

    try:
        nft.apply(adds)
    except BackendError as exc:
        report.failed(entries, f"nft: {exc}")


def _native_verdict(rule: dict[str, Any], holders: Others, ports: Any, now: set[str]) -> tuple[str, str]:
    """("add", ""), ("there", why) or ("no", why) for one journaled native rule, against the rules there now."""
    from cni_reaper.reap.holders import NATIVE, address, native_addresses, native_ports
    from cni_reaper.reap.netfilter.nftables.rules import DNAT_CHAINS, parse_rule

    parsed = parse_rule(dict(rule, handle=0))  # journaled with its handle since 0.4; added back without
    if parsed is None:
        return "no", "its journaled rule is not one of the plugins' native rules"
    if not native_addresses(parsed) or parsed.action not in ("dnat", "masquerade") or (
            parsed.chain in DNAT_CHAINS and not native_ports(parsed)):
        return "no", BROADER
    if _native_key(rule) in now:
        return "there", "already there"
    held = holders.of(native_addresses(parsed))
    if held is None and parsed.chain in DNAT_CHAINS:
        held = ports.shadowed(native_ports(parsed), parsed.comment or "", address(parsed.dnat_addr) or "", NATIVE)
    return ("no", held) if held else ("add", "")


def _native_key(rule: dict[str, Any]) -> str:
    """What makes a native rule the same rule: where it is, what it matches and does, and whose it is (its
    comment: a live allocation's masquerade of the same address is another rule)."""
    from cni_reaper import jsonio

    return jsonio.dumps([rule.get("family"), rule.get("table"), rule.get("chain"), rule.get("expr"),
                         rule.get("comment")])


def _cache(entries: list[Removed], holders: Others, report: Report, dry_run: bool) -> None:
    from cni_reaper import jsonio
    from cni_reaper.reap import cache

    for e in entries:
        it = e.item
        now = cache.current(it["cacheDir"], it["entry"])
        if now is None:
            report.gone.append((e, f"libcni no longer caches {it['entry']} (its DEL ran): nothing to put back"))
            continue
        current = now.doc
        original = jsonio.loads(it["content"])
        released = set(cache.Cached(it["entry"], original, 0).ips) - set(cache.Cached(it["entry"], current, 0).ips)
        if current != _forgotten(original, released):
            report.no(e, f"libcni's cached result {it['entry']} was rewritten since (a newer life)")
            continue
        taken = holders.of(released)
        if taken:  # the runtime hands the cached result to a later DEL: its plugins would remove the holder's rules
            report.no(e, f"libcni's cached result {it['entry']} would name an address again that is not its own "
                         f"now: {taken} (a later DEL of this attachment would remove its rules)")
            continue
        if not dry_run and not cache.put_back(it["cacheDir"], it["entry"], it["content"]):
            report.no(e, f"libcni's cached result {it['entry']} could not be written")
            continue
        report.ok(e, f"libcni's cached result {it['entry']}")


def _forgotten(original: dict[str, Any], released: set[str]) -> dict[str, Any]:
    from cni_reaper import jsonio
    from cni_reaper.reap import cache

    doc = dict(original)
    result = cache.without(cache.result_of(doc), released)
    doc["result"] = jsonio.dumps(result) if isinstance(doc.get("result"), str) else result
    return doc


def _record(store: Store, entries: list[Removed], holders: Others, report: Report, dry_run: bool) -> None:
    """Each attachment's newest journaled record put back (a container may have several: one per network and
    interface), unless a record of it exists now or someone else (a newer life of it being made among them)
    holds an address of it: the sweep would judge that life's rules by the old record."""
    by_key: dict[Any, list[Removed]] = {}
    for e in entries:
        k = e.item.get("key")
        by_key.setdefault(tuple(k) if isinstance(k, list) else None, []).append(e)
    for group in by_key.values():
        _record_of(store, group, holders, report, dry_run)


def _record_of(store: Store, entries: list[Removed], holders: Others, report: Report, dry_run: bool) -> None:
    from cni_reaper.state.record import ips, key_of, of_document, problem

    newest = max(entries, key=lambda e: e.at)
    rec = newest.item["record"]
    if problem(rec) is not None:
        report.no(newest, "the journaled record is not one the reader takes")
        return
    held = holders.of(ips(*of_document(rec).lives))
    if store.load(*key_of(rec)) is not None or held:
        for e in entries:
            report.no(e, held or "a record of this attachment exists (a newer life)")
        return
    if not dry_run and not store.save(of_document(rec)):
        report.no(newest, "a later cni-reaper's record of this attachment is there, kept as it is")
        return
    report.ok(newest, "the record")
    for e in entries:
        if e is not newest:
            report.ok(e, "(an older journaled record)")
