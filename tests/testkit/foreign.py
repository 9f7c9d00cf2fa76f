"""A live task that is no CNI attachment: a namespace of its own at FOREIGN_IP (port 80 served by the test),
reached from the sandbox's host netns through a veth pair: what an operator's, a firewall manager's or another
runtime's DNAT of a host port sends connections to (the red teams' undo tests)."""

from __future__ import annotations

import subprocess

FOREIGN_IP = "172.31.9.2"


def foreign_task(sb) -> str:
    """A new namespace of the sandbox holding FOREIGN_IP/24 (its gateway 172.31.9.1 on the host side); its path."""
    live = sb.container()
    name = live.rsplit("/", 1)[1]
    sb.run(["ip", "link", "add", "fo0", "type", "veth", "peer", "name", "fo1", "netns", name], check=True)
    sb.run(["sh", "-ec", "ip addr add 172.31.9.1/24 dev fo0 && ip link set fo0 up"], check=True)
    subprocess.run(["ip", "netns", "exec", name, "sh", "-ec", f"ip addr add {FOREIGN_IP}/24 dev fo1 && ip link set fo1 up "
                    "&& ip link set lo up && ip route add default via 172.31.9.1"], check=True)
    return live
