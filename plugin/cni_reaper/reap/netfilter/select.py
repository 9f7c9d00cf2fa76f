"""The backend for one family's iptables tables: the flavour its tool on PATH uses (flavour.py), unless the
configuration says which. Backends are imported only when selected: the hot path imports none of this."""

from __future__ import annotations

from cni_reaper.reap.netfilter.interface import Backend, BackendError


def backend_of(backend: str = "auto", family: int = 4) -> Backend:
    """The backend for one family's tables: the flavour its tool on PATH uses, unless `backend` says which."""
    from cni_reaper.reap.netfilter import flavour as flavours
    from cni_reaper.reap.netfilter.iptables.restore import SaveRestoreBackend

    found, why = flavours.detect(backend, family=family)
    if found is None:
        raise BackendError(why)
    if found == "legacy":
        from cni_reaper.reap.netfilter.iptables import iptc

        if iptc.available():
            return iptc.IptcBackend()
    return SaveRestoreBackend(found)
