"""What a rule names and who maps a host port now, asked by whatever puts back what a clean-up removed
(reap/undo.py) and by an ADD's look at its host ports: the addresses a rule names and the host ports it maps,
read from parsed rules (iptables' saved text through `iptables.rules.parse_rule`, native rules through
`nftables.rules.parse_rule`), both families, and the hostport DNAT chains as they are now, both worlds. Who
holds an address is the holdings' one answer (claims.Holdings, Others for undo).

A put-back is refused when one address it names is held by another attachment, or when it maps a host port
(protocol and port; with or without a host IP: a mapping of a host IP is evaluated first and would shadow
the live one, one without shadows it where the live one has none) that another container maps now. An ADD
asks the same (`mapped_now`, PortMap.others) of the host ports it was just given: who else maps them.
"""

from __future__ import annotations

import os

from cni_reaper.cni.ipaddr import parse_ip
from cni_reaper.values import EVERY_PORT, HostPort, Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.reap.netfilter.iptables.rules import Rule, Table
    from cni_reaper.reap.netfilter.nftables.rules import NativeRule

PROTOCOLS = ("tcp", "udp", "sctp")
IPTABLES_DNAT_CHAIN = "CNI-HOSTPORT-DNAT"


def address(text: str | None) -> str | None:
    """The address of `10.0.0.2`, `10.0.0.2/32`, `10.0.0.2:80`, `[fd00::2]:80`, `fd00::2/128` (None: none)."""
    if not text:
        return None
    t = text[1:].split("]")[0] if text.startswith("[") else text.split("/")[0]
    if t.count(":") == 1 and "." in t:
        t = t.split(":")[0]
    try:
        return parse_ip(t)[1]
    except ValueError:
        return None


# -- what a rule names -------------------------------------------------------------------------------------
_ADDRESS_OPTIONS = ("-s", "--source", "-d", "--destination", "--to-destination", "--to-source")


def rule_addresses(rule: Rule, options: tuple[str, ...] = _ADDRESS_OPTIONS) -> set[str]:
    """Every address an iptables rule names (source, destination, DNAT and SNAT targets; only those of
    `options`), both families."""
    tokens = rule.tokens
    out = {address(tokens[i + 1]) for i, tok in enumerate(tokens[:-1]) if tok in options}
    return {a for a in out if a}


def rule_ports(rule: Rule, every: bool = False) -> set[HostPort]:
    """The host ports an iptables rule of CNI-HOSTPORT-DNAT maps (`-p P ... --dports A,B` or `--dport A`). With
    `every` (a rule that gives ports to someone), one that matches no port holds them all (EVERY_PORT)."""
    tokens = rule.tokens
    found: dict[str, str] = {}
    ports: list[int] = []
    for i, tok in enumerate(tokens[:-1]):
        role = _PORT_OPTIONS.get(tok)
        negated = i > 0 and tokens[i - 1] == "!"
        if role == "ports":  # `! --dport 22` matches every port but 22: it holds them all (as far as a port says)
            ports += [EVERY_PORT] if negated else _port_list(tokens[i + 1])
        elif role is not None and not negated:  # `! -p tcp` names no protocol, `! -d A` no host IP
            found[role] = tokens[i + 1]
    if every and not ports:
        ports = [EVERY_PORT]
    proto, host_ip = found.get("proto", "").lower(), address(found.get("host_ip")) or ""
    return {HostPort(proto, p, host_ip) for p in ports}


_PORT_OPTIONS = {"-p": "proto", "--protocol": "proto", "-d": "host_ip", "--destination": "host_ip",
                 "--dports": "ports", "--dport": "ports", "--destination-ports": "ports", "--destination-port": "ports"}


def _port_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition(":")
        if low.isdigit() and (not high or high.isdigit()):
            out += range(int(low), int(high or low) + 1) if int(high or low) - int(low) < 65536 else []
    return out


def native_addresses(rule: NativeRule) -> set[str]:
    """Every address a native rule of the plugins names (source, destination, DNAT target), both families."""
    out = {address(a) for a in (rule.saddr, rule.daddr, rule.dnat_addr)}
    return {a for a in out if a}


def native_ports(rule: NativeRule) -> set[HostPort]:
    """The host ports a native DNAT rule of portmap maps: its `dport` match, of the protocol it names (`tcp
    dport`, `udp dport`, `sctp dport`, or `meta l4proto P th dport`), with the host IP of `hostip_hostports`."""
    proto, ports = "", list[int]()
    for e in rule.raw.get("expr") or [] if isinstance(rule.raw, dict) else []:
        m = e.get("match") if isinstance(e, dict) else None
        if isinstance(m, dict) and m.get("op") in ("==", "in"):
            p, values = _native_match(m.get("left"), m.get("right"))
            proto, ports = p or proto, ports + values
    host_ip = (address(rule.daddr) or "") if rule.chain == "hostip_hostports" else ""
    return {HostPort(proto, p, host_ip) for p in ports}


def _native_match(left: Any, right: Any) -> tuple[str, list[int]]:
    """(protocol, ports) one match of a native rule names: `tcp dport 8080` gives both, `meta l4proto tcp`
    the protocol, `th dport 8080` the port."""
    payload = left.get("payload") if isinstance(left, dict) else None
    meta = left.get("meta") if isinstance(left, dict) else None
    if isinstance(payload, dict) and payload.get("field") == "dport":
        proto = payload.get("protocol")
        return (proto if proto in PROTOCOLS else ""), _native_port_values(right)
    if isinstance(meta, dict) and meta.get("key") == "l4proto" and right in PROTOCOLS:
        return str(right), []
    return "", []


def _native_port_values(right: Any) -> list[int]:
    """The ports a dport match's right side names: a port, a set of them, a range."""
    if isinstance(right, int) and not isinstance(right, bool):
        return [right]
    if not isinstance(right, dict):
        return []
    if isinstance(right.get("set"), list):
        return [p for v in right["set"] for p in _native_port_values(v)]
    span = right.get("range")
    if not (isinstance(span, list) and len(span) == 2 and all(isinstance(v, int) for v in span)):
        return []
    low, high = span
    return list(range(low, high + 1)) if 0 <= high - low < 65536 else []


# -- who maps a host port now -----------------------------------------------------------------------------
class Mapping(Value):
    """One host port held now: a DNAT rule that maps it and the attachment its tag names (container ID, "" when
    no tag names one; network, "" when the rule does not say: portmap's native rules name only the container),
    or another holder (`by`: what holds it when it is no CNI attachment's: another chain's DNAT, a socket);
    `to`: the address it sends the port to, where the rule says ("": not read); `world`: the plugins' world
    of the rule (IPTABLES or NATIVE; "" for another holder)."""

    __slots__ = ("by", "container_id", "network", "port", "to", "world")

    def __init__(self, port: HostPort, container_id: str, network: str = "", by: str = "", to: str = "",
                 world: str = "") -> None:
        self.port, self.container_id, self.network, self.by, self.to = port, container_id, network, by, to
        self.world = world


IPTABLES, NATIVE = "iptables", "native"  # the plugins' two worlds of hostport mappings


class PortMap:
    """The host ports mapped now, and by whom (a rule's comment: the plugins tag both worlds' DNAT with the
    container), from the hostport DNAT chains of the tables read (iptables) and the native hostport chains.
    `blind`: the worlds that could not be read (then no mapping may be put back: who maps what is not known)."""

    def __init__(self) -> None:
        self.mapped: list[Mapping] = []
        self.blind: list[str] = []

    def add_iptables(self, tables: dict[str, Table], others: bool = False) -> None:
        """The hostport DNAT chain's mappings; with `others`, also every other nat chain's that holds a host
        port and is no plugin's (Docker's DOCKER, kube-proxy's KUBE-NODEPORTS, an operator's DNAT or REDIRECT)."""
        nat = tables.get("nat")
        if nat is None:
            return
        self.mapped += _hostport_mappings(nat)
        if others:
            self.mapped += [Mapping(p, "", by=f"a rule of nat {r.chain}")
                            for r in _foreign_holders(nat) for p in rule_ports(r, every=True)]

    def add_sockets(self, sockets: list[HostPort]) -> None:
        """Sockets of this network namespace that hold a host port (listening TCP, bound UDP)."""
        self.mapped += [Mapping(p, "", by="a socket listening on the host") for p in sockets]

    def add_native(self, rules: list[NativeRule]) -> None:
        from cni_reaper.reap.netfilter.nftables.rules import DNAT_CHAINS, HOSTPORT_TABLES

        for r in rules:
            if (r.family, r.table) in HOSTPORT_TABLES and r.chain in DNAT_CHAINS and r.action == "dnat":
                self.mapped += [Mapping(p, r.comment or "", to=address(r.dnat_addr) or "", world=NATIVE)
                                for p in native_ports(r)]

    def add_foreign_native(self, rules: list[NativeRule]) -> None:
        """The DNAT and REDIRECT rules of nftables tables that are neither the plugins' nor iptables' (a firewall
        manager's, kube-proxy's nftables mode): each holds the ports it matches, every port when it matches
        none."""
        for r in rules:
            if r.action in ("dnat", "redirect"):
                self.mapped += [Mapping(p, "", by=f"a rule of nftables table {r.family} {r.table}")
                                for p in native_ports(r) or {HostPort("", EVERY_PORT)}]

    def shadowed(self, ports: set[HostPort], cid: str, to: str = "", world: str = "") -> str | None:
        """Why mapping `ports` for container `cid` (to address `to`, where known, in the plugins' `world`) would
        shadow another container's mapping now, or another life's of the same container (a mapping to another
        address, or in the other world: one life maps its ports in one), a mapping whose owner no tag names
        included."""
        if ports and self.blind:
            return f"who maps host ports now is not known ({self.blind[0]})"
        for p in sorted(ports, key=str):
            for m in self.others(p, cid, to, world):
                held = f"host port {p.port}/{p.proto or m.port.proto or 'any'}"
                return f"{held} is held by {m.by} now" if m.by else f"{held} is mapped by another allocation now"
        return None

    def doubled(self) -> dict[str, set[str]]:
        """The host ports (port/protocol) that more than one container maps now, and those containers ("" for
        a rule no tag names)."""
        owners: dict[str, set[str]] = {}
        for m in self.mapped:
            owners.setdefault(f"{m.port.port}/{m.port.proto or 'any'}", set()).add(m.container_id)
        return {port: who for port, who in owners.items() if len(who) > 1}

    def others(self, port: HostPort, cid: str, to: str = "", world: str = "") -> list[Mapping]:
        """The mappings of `port` (same port and protocol, any host IP) by another container than `cid`, or by
        it to another address than `to` or in another world than `world` (where both are known: another life of
        it, made since; a newer life may have the same address again)."""
        return [m for m in self.mapped if port.clashes(m.port)
                and (m.container_id != cid or (to and m.to and m.to != to) or (world and m.world and m.world != world))]


def port_map() -> PortMap:
    """Every host port mapped on this host now: the nat chains of both iptables flavours (each that has its
    tools here) in both families, the plugins' native hostport tables, every other nftables table's DNAT and
    REDIRECT, and the host's listening sockets. A put-back in one world
    shadows a mapping in any other: the kernel runs every world's nat hooks."""
    from cni_reaper.reap.netfilter import flavour
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.iptables.restore import SaveRestoreBackend
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend

    pm = PortMap()
    for name in ("nft", "legacy"):
        backend = SaveRestoreBackend(name)
        for family in (4, 6):
            if flavour.which(f"{'ip6' if family == 6 else 'ip'}tables-{name}-save") is None:
                continue  # no such tool here: no such tables
            try:
                pm.add_iptables(backend.read(family), others=True)
            except BackendError as exc:
                pm.blind.append(f"ipv{family} iptables-{name}: {exc}")
    nft = NftBackend()
    try:
        pm.add_native(nft.read())
        pm.add_foreign_native(nft.read(nft.foreign_tables()))
    except BackendError as exc:
        pm.blind.append(f"native tables: {exc}")
    try:
        pm.add_sockets(listening())
    except OSError as exc:
        pm.blind.append(f"the host's sockets: {exc.strerror}")
    return pm


# /proc/net/<file>: the protocol, and the socket states that hold a port (TCP: LISTEN; UDP: any bound socket)
_SOCKET_FILES = (("tcp", "tcp", {"0A"}), ("tcp6", "tcp", {"0A"}), ("udp", "udp", None), ("udp6", "udp", None))


def listening(proc_net: str = "/proc/net") -> list[HostPort]:
    """The host ports sockets of this process's network namespace hold: TCP sockets listening, UDP sockets
    bound, SCTP endpoints (a task of the host network serving the port, another runtime's proxy). OSError:
    /proc not there."""
    out = []
    for name, proto, states in _SOCKET_FILES:
        for fields in _proc_table(f"{proc_net}/{name}"):
            if len(fields) > 3 and (states is None or fields[3] in states):
                local_ip, _, port = fields[1].rpartition(":")
                host_ip = "" if set(local_ip) == {"0"} else _proc_address(local_ip)
                out.append(HostPort(proto, int(port, 16), host_ip))
    return out + _sctp_endpoints(f"{proc_net}/sctp/eps")


def _sctp_endpoints(path: str) -> list[HostPort]:
    """The ports SCTP endpoints are bound to (`ENDPT SOCK STY SST HBKT LPORT UID INODE LADDRS...`: the port in
    decimal, the addresses as text; none, or a wildcard among them: every address). The file is there only
    once the sctp module is loaded: no file, no endpoint."""
    out = []
    for fields in _proc_table(path):
        if len(fields) > 5 and fields[5].isdigit():
            addresses = fields[8:]
            wildcard = not addresses or any(a in ("0.0.0.0", "::") for a in addresses)
            out += [HostPort("sctp", int(fields[5]), a) for a in ([""] if wildcard else addresses)]
    return out


def _proc_table(path: str) -> list[list[str]]:
    """The rows of a /proc/net table (its header line dropped), split on blanks; none when the file is not
    there (no such family or module here)."""
    try:
        with open(path) as f:
            return [line.split() for line in f.read().splitlines()[1:]]
    except FileNotFoundError:
        return []


def _proc_address(hexed: str) -> str:
    """The address /proc/net prints as host-order 32-bit words in hex."""
    import socket

    raw = b"".join(int(hexed[i:i + 8], 16).to_bytes(4, "little") for i in range(0, len(hexed), 8))
    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw)


def _foreign_holders(nat: Table) -> list[Rule]:
    """The rules of nat chains that are no plugin's (the plugins' own are reached through the tagged jumps of
    the hostport chain) that give a host port to someone."""
    return [r for chain, rules in nat.chains.items() if not chain.startswith("CNI-") for r in rules if _holds_port(r)]


def _hostport_mappings(nat: Table) -> list[Mapping]:
    """The mappings of the hostport DNAT chain: each jump's ports, the container its tag names, and the
    address its container's CNI-DN chain sends them to (one mapping per address; "" when none is read)."""
    from cni_reaper.reap.netfilter.iptables.plan import parse_tag

    out = []
    for r in nat.chains.get(IPTABLES_DNAT_CHAIN, []):
        tag = parse_tag(r.comment or "") or ("", "", "")
        out += [Mapping(p, tag[2], tag[1] or "", to=to, world=IPTABLES) for p in rule_ports(r)
                for to in dnat_targets(nat.chains.get(r.target or "", [])) or [""]]
    return out


def _holds_port(rule: Rule) -> bool:
    """A nat rule that gives a host port to someone: a DNAT, REDIRECT or NETMAP (outside the chains where
    NETMAP maps sources), or kube-proxy's jump of a node port to its service."""
    if rule.target == "NETMAP":
        return rule.chain not in ("POSTROUTING", "INPUT")
    return rule.target in ("DNAT", "REDIRECT") or rule.chain == "KUBE-NODEPORTS"


def dnat_targets(rules: list[Rule]) -> list[str]:
    """The addresses the DNAT rules among `rules` send connections to (those of portmap's CNI-DN chain of a
    container: the address of the life that maps its ports)."""
    return sorted({a for r in rules if r.target == "DNAT" for a in rule_addresses(r, ("--to-destination",))})


# how long an ADD waits for the hostport tables to be read: one that hangs (a stuck nft, a lock) leaves who else
# maps the ports unknown (blind: nothing is removed) instead of stalling the allocation
READ_BUDGET_SECONDS = 3


def mapped_now(backend: str, families: set[int]) -> PortMap:
    """The host ports mapped now in the world an ADD's own portmap wrote to: the nat table of the `backend`
    setting's iptables flavour in `families` (its save tool, not python-iptables: loading libiptc costs more
    than the save) and the plugins' native hostport tables of those families (a connection to a host port
    over IPv4 meets IPv4's DNAT only), all read at once. What cannot be read is `blind`."""
    from cni_reaper.reap.netfilter import processes
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.iptables.rules import parse_save
    from cni_reaper.reap.netfilter.nftables.backend import NftBackend
    from cni_reaper.reap.netfilter.nftables.rules import HOSTPORT_TABLES

    pm = PortMap()
    argvs, saves = _save_argvs(backend, families, pm)
    nft = NftBackend()
    tables = tuple(t for t in HOSTPORT_TABLES if (6 if t[0] == "ip6" else 4) in families)  # a family's own DNAT
    listings = [[nft.binary, *argv] for argv in nft.listings(tables)] if nft.binary else []
    try:
        done = processes.run_all([*argvs, *listings], timeout=READ_BUDGET_SECONDS)
    except OSError as exc:
        pm.blind.append(f"the tables could not be read ({exc})")
        return pm
    for family, argv, d in zip(saves, argvs, done):
        if d.code == 0:
            pm.add_iptables(parse_save(_chain_of(d.out, IPTABLES_DNAT_CHAIN)))
        elif "does not exist" not in d.err:  # no nat table: nothing maps a port there
            pm.blind.append(f"ipv{family} iptables: {os.path.basename(argv[0])} exited {d.code}: {d.err.strip()[:200]}")
    try:
        pm.add_native(nft.parsed(tables, [(d.code, d.out, d.err) for d in done[len(saves):]]))
    except BackendError as exc:
        pm.blind.append(f"native tables: {exc}")
    return pm


def _save_argvs(backend: str, families: set[int], pm: PortMap) -> tuple[list[list[str]], list[int]]:
    """The save commands of the nat table of each family's iptables flavour (the `backend` setting's), and their
    families; a family whose flavour is not here is blind in `pm`."""
    from cni_reaper.reap.netfilter import flavour
    from cni_reaper.reap.netfilter.interface import BackendError
    from cni_reaper.reap.netfilter.iptables.restore import SaveRestoreBackend

    argvs, saves = [], []
    for family in sorted(families):
        found, why = flavour.detect(backend, family=family)
        try:
            if found is None:
                raise BackendError(why)
            argvs.append(SaveRestoreBackend(found).save_argv(family, "nat"))
            saves.append(family)
        except BackendError as exc:
            pm.blind.append(f"ipv{family} iptables: {exc}")
    return argvs, saves


def _chain_of(saved: str, chain: str) -> str:
    """One chain's lines of a saved table (parsing a thousand attachments' rules to read one chain would cost
    an ADD milliseconds)."""
    rule, head = f"-A {chain} ", f":{chain} "
    return "\n".join(line for line in saved.split("\n")
                     if line.startswith((rule, head, "*")) or line == "COMMIT")


def iptables_owner(comment: str | None) -> str:
    """The container ID an iptables rule's tag names ("" for none)."""
    from cni_reaper.reap.netfilter.iptables.plan import parse_tag

    tag = parse_tag(comment or "")
    return tag[2] if tag else ""
