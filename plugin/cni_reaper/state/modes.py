"""Two small files of the state directory's own, read and written under its lock:

- `.modes`: each network's mode (clean or observe) as its own calls last said it, so that a sweep run by
  another network's call, or by the CLI, treats that network's dead attachments as their network says:
  observed, not removed. Read by every call's sweep (stale or not), written only when a network's mode
  changes, durably: if it were lost, a network in observe mode would be cleaned by others' sweeps.
- `.observed`: for each attachment that observe mode would clean, a digest of what it would remove, so that
  its "would remove" log line and counters come once per attachment and change, not once per call.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cni_reaper.state.store import Store

from cni_reaper import jsonio

MODES = ".modes"
OBSERVED = ".observed"
MAX_BYTES = 4 << 20


def _load(store: Store, name: str) -> dict[str, str]:
    data, _ = store.dir.read(name, MAX_BYTES)
    try:
        doc = jsonio.loads(data) if data else {}
    except (ValueError, RecursionError, UnicodeDecodeError):
        doc = {}
    return {k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(doc, dict) else {}


def modes(store: Store) -> dict[str, str]:
    return _load(store, MODES)


def remember_mode(store: Store, known: dict[str, str], network: str, mode: str) -> None:
    """Note a network's mode when it differs from what the file says (the caller holds the lock)."""
    if known.get(network, "clean") == mode:
        return
    known[network] = mode
    try:
        store.dir.write(MODES, jsonio.dumps(known).encode(), durable=True)
    except OSError:
        pass


def observed(store: Store) -> dict[str, str]:
    return _load(store, OBSERVED)


def save_observed(store: Store, seen: dict[str, str]) -> None:
    try:
        store.dir.write(OBSERVED, jsonio.dumps(seen).encode())
    except OSError:
        pass
