"""Which iptables flavour the host uses: the one the other plugins will use, i.e. the `iptables` on PATH.

Resolved without running anything: Debian's alternatives point `iptables` at xtables-nft-multi or
xtables-legacy-multi, and the multi binary's name says which. `backend` in the config overrides this.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from typing import Literal, Mapping

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


def classify(binary: str) -> Flavour | None:
    target = os.path.basename(os.path.realpath(binary))
    if "nft" in target:
        return "nft"
    if "legacy" in target:
        return "legacy"
    return None


def detect(backend: str = "auto", env: Mapping[str, str] | None = None) -> tuple[Flavour | None, str]:
    """(flavour, explanation). flavour is None when no usable iptables was found."""
    if backend in BINARIES:
        found = which(BINARIES[backend], env)
        if found:
            return backend, f"backend {backend} set in config ({found})"  # type: ignore[return-value]
        return None, f"backend {backend} set in config but {BINARIES[backend]} is not on PATH"
    found = which("iptables", env)
    if not found:
        return None, "no iptables on PATH (install the iptables package)"
    flavour = classify(found)
    if flavour is None:
        # An iptables that is neither multi binary: an old legacy-only build.
        return "legacy", f"{found} is not an xtables multi binary; assuming legacy"
    return flavour, f"{found} -> {os.path.realpath(found)}"
