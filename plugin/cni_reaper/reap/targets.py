"""What a clean-up is given: the dead lives of attachments whose leftovers are to go (Target), what each
dead address's own reservation is (Expect), and the parts of an attachment's leftovers (PARTS). Built by the
sweep, narrowed by the claims (claims.py), consumed by the clean-up engine and the planners; a leaf module."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# masq: bridge's masquerade (iptables chain and jump, or native rules); dnat: portmap's (iptables or native);
# forward: the firewall plugin's CNI-FORWARD rules; reservation: host-local's; conntrack: the entries that
# still point at the dead addresses
PARTS = frozenset({"masq", "dnat", "forward", "reservation", "conntrack"})
NETFILTER_PARTS = frozenset({"masq", "dnat", "forward"})


@dataclass(frozen=True)
class Expect:
    """Which reservation of a dead address is the dead life's own, so that it may be released and so that any
    other is seen as someone else's (another container, or a newer life of the same one):
    - `ident` known (recorded at ADD: inode, modification and change time): that very file, in `data_dir`;
    - else a file naming `owner` (container ID, ifname; "" matches any) not modified after `not_after` (ns
      since the epoch): the life began after its reservation was made (a record of cni-reaper 0.2: its
      createdAt; an attachment known from libcni's cache: when the entry was written);
    - `not_after` None too: any file naming `owner` (the runtime's own word: GC)."""

    data_dir: str
    owner: tuple[str, str]
    ident: tuple[int, int, int] | None = None
    not_after: int | None = None
    dev: int | None = None  # the file system the reservation was on (None: not recorded)
    rebooted: bool = False  # the life was recorded in an earlier boot (a tmpfs data dir is empty since)


@dataclass(frozen=True)
class Target:
    """Dead lives of one attachment whose leftovers are to go, and the settings they are cleaned with."""

    network: str
    container_id: str
    ifname: str  # "" for an attachment known only by its tags: its reservations match any ifname
    dead_ips: frozenset[str]  # plain addresses, both families
    whole: bool  # no live life of the attachment remains: its per-container chains may go
    keep_masq_chain: bool = False  # a DEL with a live netns is in flight: bridge tears the chain down itself
    parts: frozenset[str] = PARTS
    any_source: bool = False  # found by its tags only (orphans): its masquerade jumps go whatever the source IP
    expect: dict[str, Expect] = field(default_factory=dict, compare=False)  # dead address -> its own reservation
    backend: str = "auto"  # the attachment's iptables backend setting
    cache_dir: str = ""  # libcni's cache the attachment's runtime uses ("" unknown)
    forming: bool = False  # its path holds a newer namespace and no reservation can tell: a new life may be forming
    by_runtime: bool = False  # the runtime said the attachment is over (its own DEL, GC's valid list)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.network, self.container_id, self.ifname)

    def narrowed(self, dead_ips: frozenset[str], whole: bool) -> Target:
        return replace(self, dead_ips=dead_ips, whole=whole, any_source=self.any_source and whole)
