"""Finding the real plugin a wrapper stands for: the first file of that name on the plugin path that is not
cni-reaper itself, judged by file identity (device and inode of what the name resolves to), not by name:
a wrapper directory may hold several links to cni-reaper, and the path may name it twice."""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Nomad's cni_path default (1.11.2+), and Debian's and Fedora's plugin directories: where a bare run (Nomad's
# fingerprint, which passes no CNI_PATH) looks when the settings name no cniPath
DEFAULT_PATH = ("/opt/cni/bin", "/usr/libexec/cni", "/usr/lib/cni")


def wrapped_name(argv0: str) -> str | None:
    """The plugin this process stands for when it was started under another name (a link `portmap` to it);
    None when it runs as cni-reaper (any name starting so, a Python interpreter, a module)."""
    name = os.path.basename(argv0)
    if not name or name.startswith(("cni-reaper", "python", "-")) or name.endswith(".py"):
        return None
    return name


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def own_identities() -> set[tuple[int, int]]:
    """cni-reaper's own file(s): what this process was started as (the wrapper link resolves to it) and, in the
    bundle, the executable."""
    out = set()
    for path in (sys.argv[0], sys.executable if getattr(sys, "frozen", False) else ""):
        ident = _ident(path) if path else None
        if ident is not None:
            out.add(ident)
    return out


def search_path(env: Mapping[str, str], configured: str | None) -> list[str]:
    """CNI_PATH as the runtime passes it; else the settings' cniPath; else the usual plugin directories."""
    text = env.get("CNI_PATH") or configured or ":".join(DEFAULT_PATH)
    return [d for d in text.split(":") if d]


def find(name: str, dirs: list[str], own: set[tuple[int, int]]) -> str | None:
    """The first regular, executable file `name` in `dirs` (symlinks followed, as libcni's FindInPath does)
    that is not cni-reaper."""
    if not name or "/" in name:
        return None
    for d in dirs:
        candidate = os.path.join(d, name)
        ident = _ident(candidate)
        if ident is not None and ident not in own and os.access(candidate, os.X_OK):
            return candidate
    return None
