"""What a clean-up is given: the dead lives of attachments whose leftovers are to go (Target), and the parts
of an attachment's leftovers (PARTS). Built by the sweep (sweep.py), consumed by the clean-up engine and the
planners; a leaf module."""

from __future__ import annotations

from dataclasses import dataclass

# masq: bridge's masquerade (iptables chain and jump, or native rules); dnat: portmap's (iptables or native);
# forward: the firewall plugin's CNI-FORWARD rules; reservation: host-local's; conntrack: the entries that
# still point at the dead addresses
PARTS = frozenset({"masq", "dnat", "forward", "reservation", "conntrack"})


@dataclass(frozen=True)
class Target:
    """Dead lives of one attachment whose leftovers are to go."""

    network: str
    container_id: str
    ifname: str  # "" for an attachment known only by its tags: its reservations match any ifname
    dead_ips: frozenset[str]  # plain addresses, both families
    whole: bool  # no live incarnation of the attachment remains: its per-container chains may go
    keep_masq_chain: bool = False  # a DEL with a live netns is in flight: bridge tears the chain down itself
    parts: frozenset[str] = PARTS
    any_source: bool = False  # found by its tags only (orphans): its masquerade jumps go whatever the source IP

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.network, self.container_id, self.ifname)
