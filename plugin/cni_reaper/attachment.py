"""Building and updating attachment records from an invocation (pure, apart from the netns probe)."""

from __future__ import annotations

import ipaddress
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from . import __version__, netns
from .errors import INVALID_CONFIG, CniError
from .models import MAX_EARLIER_INCARNATIONS, Incarnation, NetnsId, PrevResult, Record, RecordedIP


def now() -> datetime:
    return datetime.now(timezone.utc)


def parse_prev_result(prev: dict[str, Any] | None) -> PrevResult | None:
    if prev is None:
        return None
    try:
        return PrevResult.model_validate(prev)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "prevResult"
        raise CniError(INVALID_CONFIG, "prevResult is not a valid CNI result",
                       f"prevResult.{where}: {first.get('msg')}") from None


def recorded_ips(prev: PrevResult) -> list[RecordedIP]:
    out: list[RecordedIP] = []
    for entry in prev.ips:
        iface = ipaddress.ip_interface(entry.address)
        ip = RecordedIP(address=str(iface.ip), prefix=iface.network.prefixlen, family=iface.version)
        if ip not in out:
            out.append(ip)
    return out


def incarnation(netns_path: str, prev: PrevResult | None, port_mappings: list) -> Incarnation:
    ident = netns.identity(netns_path)
    return Incarnation(
        netns=netns_path,
        netnsId=NetnsId(dev=ident.dev, ino=ident.ino) if ident else None,
        ips=recorded_ips(prev) if prev else [],
        portMappings=list(port_mappings),
        createdAt=now(),
    )


def same_life(a: Incarnation, b: Incarnation) -> bool:
    """Two incarnations describe the same life when netns and IPs agree (ports may be re-sent)."""
    return a.netns == b.netns and a.netnsId == b.netnsId and sorted(a.ips, key=str) == sorted(b.ips, key=str)


def merge(existing: Record | None, network: str, container_id: str, ifname: str,
          current: Incarnation, cni_args: dict[str, str]) -> tuple[Record, bool]:
    """The record after an ADD (or an adopting CHECK). Returns (record, an earlier life was kept)."""
    earlier: list[Incarnation] = []
    kept = False
    if existing is not None:
        earlier = list(existing.earlier)
        if existing.deleted is not None or not same_life(existing.current, current):
            earlier.append(existing.current)
            kept = True
        else:
            current = current.model_copy(update={"createdAt": existing.current.createdAt})
    return Record(
        network=network,
        containerID=container_id,
        ifname=ifname,
        current=current,
        earlier=earlier[-MAX_EARLIER_INCARNATIONS:],
        cniArgs=cni_args,
        pluginVersion=__version__,
    ), kept
