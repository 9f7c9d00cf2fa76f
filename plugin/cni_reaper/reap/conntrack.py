"""Connection-tracking entries that keep flows pinned to dead addresses, removed over ctnetlink.

A dead allocation's DNAT made conntrack entries whose reply source is its IP; a client that keeps sending
(DNS, syslog, statsd: UDP from one source port) refreshes them with every packet, so once the DNAT rules are
gone and a new allocation maps the same host port, its packets still follow the old entry to the dead IP.
Deleting the entries whose reply source or original destination is a dead IP lets the next packet take
the new DNAT (kube-proxy clears UDP entries of removed endpoints for the same reason).

This speaks ctnetlink directly over a netlink socket: one dump per family, parsed for the two addresses,
then the matching entries deleted in batches, each by its original tuple (copied from the dump) and its ID.
pyroute2's Conntrack does the same, and the tests hold this module to it; measured here, pyroute2 0.9.7 spends
about 0.2 s importing, 0.07 ms parsing each dumped entry and 0.6 ms per delete, which made 3,000 entries
take over 2 s (this module: see docs/performance.md).
"""

from __future__ import annotations

import _socket as socket  # the C module: `socket` imports selectors and enum, milliseconds on every clean-up
import errno
import os
import struct
import time

from cni_reaper.files import hold_deadline

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

NETLINK_NETFILTER = 12
NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_GET, IPCTNL_MSG_CT_DELETE = 1, 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
CTA_TUPLE_ORIG, CTA_TUPLE_REPLY, CTA_ID, CTA_ZONE = 1, 2, 12, 18
CTA_TUPLE_IP = 1
CTA_IP_V4_SRC, CTA_IP_V4_DST, CTA_IP_V6_SRC, CTA_IP_V6_DST = 1, 2, 3, 4
NLA_TYPE_MASK = 0x3FFF
BATCH = 256  # delete messages per send
UNAVAILABLE = (errno.EOPNOTSUPP, errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT)  # no conntrack here: nothing to clear
_HDR = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")
_NLA = struct.Struct("=HH")


class ConntrackError(OSError):
    pass


def _attrs(buf: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """type -> (payload start, payload end) of the netlink attributes in buf[start:end]."""
    out = {}
    while start + 4 <= end:
        length, kind = _NLA.unpack_from(buf, start)
        if length < 4:
            break
        out[kind & NLA_TYPE_MASK] = (start + 4, start + length)
        start += (length + 3) & ~3
    return out


def _tuple_ip(buf: bytes, span: tuple[int, int] | None, family: int) -> tuple[str | None, str | None]:
    """(source, destination) of a CTA_TUPLE_* attribute."""
    if span is None:
        return None, None
    ip = _attrs(buf, *span).get(CTA_TUPLE_IP)
    if ip is None:
        return None, None
    inner = _attrs(buf, *ip)
    kinds = (CTA_IP_V4_SRC, CTA_IP_V4_DST) if family == socket.AF_INET else (CTA_IP_V6_SRC, CTA_IP_V6_DST)
    out = []
    for kind in kinds:
        s = inner.get(kind)
        out.append(socket.inet_ntop(family, buf[s[0]:s[1]]) if s else None)
    return out[0], out[1]


class Flow:
    """What a clean-up needs of one conntrack entry: its addresses, and how to name it in a delete."""

    __slots__ = ("family", "orig_dst", "orig_tuple", "reply_src", "tail")

    def __init__(self, family: int, orig_dst: str | None, reply_src: str | None, orig_tuple: bytes,
                 tail: bytes) -> None:
        self.family, self.orig_dst, self.reply_src = family, orig_dst, reply_src
        self.orig_tuple = orig_tuple  # the raw CTA_TUPLE_ORIG attribute, header included
        self.tail = tail  # the raw CTA_ZONE and CTA_ID attributes: the same entry, in the same zone


class Socket:
    def __init__(self) -> None:
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
            self.sock.bind((0, 0))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        except OSError as exc:
            raise ConntrackError(exc.errno, f"ctnetlink: {exc.strerror}") from None
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Socket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _message(self, msg_type: int, flags: int, family: int, payload: bytes = b"") -> bytes:
        self.seq += 1
        body = _NFGEN.pack(family, 0, 0) + payload
        return _HDR.pack(_HDR.size + len(body), (NFNL_SUBSYS_CTNETLINK << 8) | msg_type, flags, self.seq, 0) + body

    def _receive(self) -> bytes:
        """The next datagram; while a lock others wait for is held (files.hold_deadline), only until its hold
        ends (ConntrackError ETIMEDOUT: a table of hundreds of thousands of entries is dumped and read for
        seconds; its entries expire in time)."""
        held = hold_deadline()
        if held is None:
            return self.sock.recv(1 << 20)
        left = held[0] - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            return self.sock.recv(1 << 20)
        except (TimeoutError, socket.timeout):
            raise ConntrackError(errno.ETIMEDOUT, f"ctnetlink: the table was not read {held[1]}") from None

    def _replies(self):
        """(type, flags, buffer, payload start, payload end) of each message received, until a dump ends."""
        while True:
            data = self._receive()
            offset = 0
            while offset + _HDR.size <= len(data):
                length, kind, flags, _seq, _pid = _HDR.unpack_from(data, offset)
                if length < _HDR.size:
                    return
                yield kind, flags, data, offset + _HDR.size, offset + length
                if kind == NLMSG_DONE:
                    return
                offset += (length + 3) & ~3

    def dump(self, family: int) -> list[Flow]:
        """Every entry of one family (AF_INET, AF_INET6)."""
        self.sock.send(self._message(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, family))
        entries = []
        for kind, _flags, buf, start, end in self._replies():
            if kind == NLMSG_DONE:
                break
            if kind == NLMSG_ERROR:
                code = -struct.unpack_from("=i", buf, start)[0]
                if code:
                    raise ConntrackError(code, f"ctnetlink dump: {os.strerror(code)}")
                continue
            attrs = _attrs(buf, start + _NFGEN.size, end)
            orig = attrs.get(CTA_TUPLE_ORIG)
            if orig is None:
                continue
            _, orig_dst = _tuple_ip(buf, orig, family)
            reply_src, _ = _tuple_ip(buf, attrs.get(CTA_TUPLE_REPLY), family)
            tail = b"".join(buf[attrs[k][0] - 4:attrs[k][1]] + b"\0" * (-(attrs[k][1] - attrs[k][0]) % 4)
                            for k in (CTA_ZONE, CTA_ID) if k in attrs)
            entries.append(Flow(family, orig_dst, reply_src, bytes(buf[orig[0] - 4:orig[1]]), tail))
        return entries

    def delete(self, entries: list[Flow]) -> int:
        """Delete the entries; those that are gone already count as deleted. Returns how many went."""
        deleted = 0
        for i in range(0, len(entries), BATCH):
            batch = entries[i:i + BATCH]
            wire = b"".join(self._message(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, e.family,
                                          e.orig_tuple + b"\0" * (-len(e.orig_tuple) % 4) + e.tail) for e in batch)
            self.sock.send(wire)
            acks = 0
            failure = None
            for kind, _flags, buf, start, _end in self._replies():
                if kind != NLMSG_ERROR:
                    continue
                acks += 1
                code = -struct.unpack_from("=i", buf, start)[0]
                if code in (0, errno.ENOENT):
                    deleted += 1
                elif failure is None:
                    failure = code
                if acks == len(batch):
                    break
            if failure is not None:
                raise ConntrackError(failure, f"ctnetlink delete: {os.strerror(failure)}")
        return deleted


def _matching(ct: Socket, addresses: set[str]) -> tuple[list[Flow], dict[str, int]]:
    doomed: list[Flow] = []
    counts: dict[str, int] = {}
    for family in sorted({socket.AF_INET6 if ":" in a else socket.AF_INET for a in addresses}):
        for e in ct.dump(family):
            hit = e.reply_src if e.reply_src in addresses else e.orig_dst if e.orig_dst in addresses else None
            if hit is not None:
                doomed.append(e)
                counts[hit] = counts.get(hit, 0) + 1
    return doomed, counts


def count(addresses: set[str]) -> dict[str, int]:
    """Per address, how many entries have it as reply source or original destination (a dry run)."""
    with Socket() as ct:
        return _matching(ct, addresses)[1]


def clear(addresses: set[str], first: Callable[[dict[str, int]], object]) -> dict[str, int]:
    """Delete the entries whose reply source or original destination is one of `addresses` (both families),
    once `first` has been told how many there are per address (the journal's intent): whatever `first` raises
    stops the clearing before any entry goes. Returns, per address, how many went."""
    with Socket() as ct:
        doomed, counts = _matching(ct, addresses)
        if counts:
            first(counts)
        if doomed:
            ct.delete(doomed)
    return counts
