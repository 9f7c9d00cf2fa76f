"""The host's links and addresses over rtnetlink, read with a plain netlink socket (two dumps): what
`probes.on_link` needs (which interfaces are bridges, every address with its prefix), without pyroute2, which
the release bundle does not ship (its import alone costs a fifth of a second). The kernel's own answer: every
address of every interface, secondary ones included."""

from __future__ import annotations

import _socket as socket  # the C module: `socket` imports selectors and enum
import struct

NETLINK_ROUTE = 0
RTM_GETLINK, RTM_GETADDR = 18, 22
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
IFLA_LINKINFO, IFLA_INFO_KIND = 18, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
NLA_TYPE_MASK = 0x3FFF
_HDR = struct.Struct("=IHHII")
_IFINFO = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_NLA = struct.Struct("=HH")


def _attrs(buf: bytes, start: int, end: int) -> dict[int, bytes]:
    out = {}
    while start + 4 <= end:
        length, kind = _NLA.unpack_from(buf, start)
        if length < 4:
            break
        out[kind & NLA_TYPE_MASK] = buf[start + 4:start + length]
        start += (length + 3) & ~3
    return out


def _dump(sock, msg_type: int, body: bytes, seq: int) -> list[bytes]:
    """The payloads of one dump's messages (an error reply raises OSError)."""
    sock.send(_HDR.pack(_HDR.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
    out: list[bytes] = []
    while True:
        data = sock.recv(1 << 20)
        offset = 0
        while offset + _HDR.size <= len(data):
            length, kind, _flags, _seq, _pid = _HDR.unpack_from(data, offset)
            if kind == NLMSG_DONE or length < _HDR.size:
                return out
            if kind == NLMSG_ERROR:
                code = struct.unpack_from("=i", data, offset + _HDR.size)[0]
                raise OSError(-code, f"rtnetlink dump {msg_type}: error {-code}")
            out.append(data[offset + _HDR.size:offset + length])
            offset += (length + 3) & ~3


def bridges_and_addresses() -> tuple[set[int], list[tuple[int, int, bytes, int]]]:
    """(the indexes of the bridges, [(interface index, family, address bytes, prefix length)]) of this
    process's network namespace. OSError when netlink cannot be asked."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
        bridges = set()
        for msg in _dump(sock, RTM_GETLINK, _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0), 1):
            _family, _type, index, _flags, _change = _IFINFO.unpack_from(msg, 0)
            info = _attrs(msg, _IFINFO.size, len(msg)).get(IFLA_LINKINFO)
            kind = _attrs(info, 0, len(info)).get(IFLA_INFO_KIND) if info is not None else None
            if kind is not None and kind.rstrip(b"\0") == b"bridge":
                bridges.add(index)
        addresses: list[tuple[int, int, bytes, int]] = []
        for msg in _dump(sock, RTM_GETADDR, _IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0), 2):
            family, prefix, _flags, _scope, index = _IFADDR.unpack_from(msg, 0)
            attrs = _attrs(msg, _IFADDR.size, len(msg))
            raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
            if raw and family in (socket.AF_INET, socket.AF_INET6):
                addresses.append((index, family, raw, prefix))
        return bridges, addresses
    finally:
        sock.close()
