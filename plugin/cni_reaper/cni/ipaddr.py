"""IP address parsing for the hot path, without the `ipaddress` module (its import alone costs more than a
whole ADD may): the C library's inet_pton/inet_ntop, whose canonical text is also what iptables-save prints."""

from __future__ import annotations

import _socket


def parse_ip(text: object) -> tuple[int, str]:
    """(family, canonical text) of an IPv4 or IPv6 address; ValueError if it is not one."""
    if not isinstance(text, str) or not text or len(text) > 45:
        raise ValueError(f"{text!r} is not an IP address")
    family = _socket.AF_INET6 if ":" in text else _socket.AF_INET
    try:
        packed = _socket.inet_pton(family, text)
    except (OSError, ValueError):
        raise ValueError(f"{text!r} is not an IP address") from None
    return (6 if family == _socket.AF_INET6 else 4), _socket.inet_ntop(family, packed)


def parse_go_cidr(text: str) -> tuple[int, str, int]:
    """(family, canonical address, prefix length) of `address/prefix` as Go's net.ParseCIDR reads it: a prefix
    of any number of ASCII digits, leading zeros allowed; ValueError otherwise."""
    addr, sep, prefix = text.partition("/")
    if not sep or not prefix or not (prefix.isascii() and prefix.isdigit()):
        raise ValueError(f"{text!r} is not in CIDR notation (address/prefix)")
    family, canonical = parse_ip(addr)
    stripped = prefix.lstrip("0") or "0"
    if len(stripped) > 3 or int(stripped) > (32 if family == 4 else 128):
        raise ValueError(f"{text!r} has an invalid prefix length")
    return family, canonical, int(stripped)
