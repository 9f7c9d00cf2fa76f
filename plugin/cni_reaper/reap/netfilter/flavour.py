"""Which iptables flavour each family uses: the one the other plugins will use, i.e. the `iptables` (IPv4)
and the `ip6tables` (IPv6) on PATH. Debian keeps the two as separate alternatives, so a host may run IPv4 on
legacy and IPv6 on nft; the reference plugins exec each tool from PATH and follow it.

Resolved without running anything: the alternatives point each tool at xtables-nft-multi or
xtables-legacy-multi, and the multi binary's name says which. `backend` in the config overrides this for
both families.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Literal

    Flavour = Literal["nft", "legacy"]

FALLBACK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BINARIES = {"nft": "iptables-nft", "legacy": "iptables-legacy"}


def search_path(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    seen: list[str] = []
    for d in (env.get("PATH", "") + ":" + FALLBACK_PATH).split(":"):
        if d and d not in seen:
            seen.append(d)
    return seen


def which(name: str, env: Mapping[str, str] | None = None) -> str | None:
    for d in search_path(env):
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def flavour_of(binary: str) -> Flavour | None:
    target = os.path.basename(os.path.realpath(binary))
    if "nft" in target:
        return "nft"
    if "legacy" in target:
        return "legacy"
    return None


def tool(family: int) -> str:
    return "ip6tables" if family == 6 else "iptables"


def detect(backend: str = "auto", env: Mapping[str, str] | None = None, family: int = 4) -> tuple[Flavour | None, str]:
    """(flavour, explanation) for one family. flavour is None when no usable iptables was found."""
    if backend in BINARIES:
        binary = BINARIES[backend].replace("iptables", tool(family))
        found = which(binary, env)
        if found:
            return backend, f"backend {backend} set in config ({found})"  # type: ignore[return-value]
        return None, f"backend {backend} set in config but {binary} is not on PATH"
    found = which(tool(family), env)
    if not found:
        return None, f"no {tool(family)} on PATH (install the iptables package)"
    flavour = flavour_of(found)
    if flavour is None:
        # An iptables that is neither multi binary: an old legacy-only build.
        return "legacy", f"{found} is not an xtables multi binary; assuming legacy"
    return flavour, f"{found} -> {os.path.realpath(found)}"
