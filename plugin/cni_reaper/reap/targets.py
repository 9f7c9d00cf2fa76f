"""What a clean-up is given: the dead lives of attachments whose leftovers are to go (Target), what each
dead address's own reservation is (Expect), and the parts of an attachment's leftovers (PARTS). Built by the
sweep, narrowed by the claims (claims.py), consumed by the clean-up engine and the planners; a leaf module."""

from __future__ import annotations

from cni_reaper.values import Key, Value

# masq: bridge's masquerade (iptables chain and jump, or native rules); dnat: portmap's (iptables or native);
# forward: the firewall plugin's CNI-FORWARD rules; reservation: host-local's; conntrack: the entries that
# still point at the dead addresses
PARTS = frozenset({"masq", "dnat", "forward", "reservation", "conntrack"})
NETFILTER_PARTS = frozenset({"masq", "dnat", "forward"})


class Expect(Value):
    """Which reservation of a dead address is the dead life's own, so that it may be released and so that any
    other is seen as someone else's (another container, or a newer life of the same one):
    - `ident` known (recorded at ADD: inode, modification and change time): that very file, in `data_dir`;
    - else a file naming `owner` (container ID, ifname; "" matches any) not modified after `not_after` (ns
      since the epoch): the life began after its reservation was made (a record of cni-reaper 0.2: its
      createdAt; an attachment known from libcni's cache: when the entry was written);
    - `not_after` None too: any file naming `owner` (the runtime's own word: GC)."""

    __slots__ = ("data_dir", "dev", "ident", "not_after", "owner", "rebooted")

    def __init__(self, data_dir: str, owner: tuple[str, str], ident: tuple[int, int, int] | None = None,
                 not_after: int | None = None, dev: int | None = None, rebooted: bool = False) -> None:
        self.data_dir, self.owner, self.ident, self.not_after = data_dir, owner, ident, not_after
        self.dev = dev  # the file system the reservation was on (None: not recorded)
        self.rebooted = rebooted  # the life was recorded in an earlier boot (a tmpfs data dir is empty since)


class Target(Value):
    """Dead lives of one attachment whose leftovers are to go, and the settings they are cleaned with."""

    __slots__ = ("any_source", "backend", "by_runtime", "cache_dir", "container_id", "dead_ips", "expect", "forming",
                 "ifname", "keep_masq_chain", "network", "parts", "reserved_in", "whole")
    _uncompared = ("expect",)

    def __init__(self, network: str, container_id: str, ifname: str, dead_ips: frozenset[str], whole: bool,
                 keep_masq_chain: bool = False, parts: frozenset[str] = PARTS, any_source: bool = False,
                 expect: dict[str, Expect] | None = None, backend: str = "auto", cache_dir: str = "",
                 forming: bool = False, by_runtime: bool = False, reserved_in: str = "") -> None:
        self.network, self.container_id = network, container_id
        self.ifname = ifname  # "" for an attachment known only by its tags: its reservations match any ifname
        self.dead_ips = dead_ips  # plain addresses, both families
        self.whole = whole  # no live life of the attachment remains: its per-container chains may go
        self.keep_masq_chain = keep_masq_chain  # a DEL with a live netns is in flight: bridge tears the chain down
        self.parts = parts
        self.any_source = any_source  # found by its tags only (orphans): its masquerade jumps go whatever the source
        self.expect: dict[str, Expect] = {} if expect is None else expect  # dead address -> its own reservation
        self.backend = backend  # the attachment's iptables backend setting
        self.cache_dir = cache_dir  # libcni's cache the attachment's runtime uses ("" unknown)
        self.forming = forming  # its path holds a newer namespace and no reservation can tell: a new life may be forming
        self.by_runtime = by_runtime  # the runtime said the attachment is over (its own DEL, GC's valid list)
        # known by its tags alone, on host-local's word: dead only when, under host-local's locks, no reservation
        # of its network names its container, in this data dir (where host-local keeps the network) or any other
        # (claims.Claims.unreserved_doubt); "" for any other target
        self.reserved_in = reserved_in

    @property
    def key(self) -> Key:
        return Key(self.network, self.container_id, self.ifname)

    def narrowed(self, dead_ips: frozenset[str], whole: bool) -> Target:
        return self.replace(dead_ips=dead_ips, whole=whole, any_source=self.any_source and whole)
