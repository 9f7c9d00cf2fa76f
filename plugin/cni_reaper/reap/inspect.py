"""What the operator's commands read of the host, changing nothing (doctor, list): which iptables each family
uses, the native nftables tables present, the CNI chains stranded in the other flavour, libcni's cache and
host-local's directories as a runtime would find them, the host ports mapped twice. tools/ reaches reap/
through this module (reading) and reap/engine.py (judging, cleaning, putting back) alone."""

from __future__ import annotations

import subprocess

from cni_reaper.reap.cache import results_dir  # noqa: F401 - where libcni makes its results directory
from cni_reaper.reap.cache import view as cache_problem  # noqa: F401 - why libcni's cache cannot be read
from cni_reaper.reap.hostlocal import holds_any  # noqa: F401 - whether host-local has given out any address
from cni_reaper.reap.netfilter.flavour import FALLBACK_PATH, detect, tool, which  # noqa: F401 - iptables here
from cni_reaper.reap.netfilter.interface import BackendError
from cni_reaper.reap.netfilter.nftables.backend import NftBackend
from cni_reaper.reap.scheduler import RIGHTS as NOMAD_RIGHTS  # noqa: F401 - what a token for sweep --nomad needs


def native_tables() -> tuple[list[str] | None, str]:
    """The native tables of plugins 1.6+ present ("family name"), and why they could not be listed ("": they
    could); None: no nft binary here."""
    from cni_reaper.reap.netfilter.nftables.rules import TABLES

    nft = NftBackend()
    if not nft.binary:
        return None, ""
    try:
        present = nft.tables()
    except BackendError as exc:
        return [], str(exc)
    return [f"{f} {n}" for f, n in TABLES if (f, n) in present], ""


def doubled_ports() -> dict[str, set[str]]:
    """The host ports (port/protocol) more than one container maps now, and those containers."""
    from cni_reaper.reap.holders import port_map

    return port_map().doubled()


def stranded_cni_chains(other: str, family: int) -> int:
    """How many CNI-* chains the nat table of the other flavour holds; 0 without running anything when that
    flavour has no nat table (no module is loaded, no table made)."""
    binary = which(f"{tool(family)}-{other}-save")
    if binary is None:
        return 0
    if other == "legacy":
        names = "/proc/net/ip_tables_names" if family == 4 else "/proc/net/ip6_tables_names"
        try:
            with open(names) as f:
                if "nat" not in f.read().split():
                    return 0
        except OSError:
            return 0
    else:
        try:
            if ("ip" if family == 4 else "ip6", "nat") not in NftBackend().tables():
                return 0
        except BackendError:
            return 0
    try:
        text = subprocess.run([binary, "-t", "nat"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in text.splitlines() if line.startswith(":CNI-"))
