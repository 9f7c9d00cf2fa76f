"""The journal of every clean-up, kept in the state directory, from which `cni-reaper undo` puts back what a
clean-up removed (README, "Undo").

One JSON line per event, appended to `.journal` and fsynced before anything of it is done:
- `intent`: what a clean-up is about to remove (or rewrite), item by item, each with everything needed to
  put it back: a rule with its table, chain, position, family and iptables flavour (or a native rule as
  nftables' JSON gives it), a chain with its rules, a reservation file with its content, libcni's cached
  result as it was, a record as it was; conntrack entries are noted as cleared (they cannot come back);
- `done`: which of an intent's items were removed (a crash between the two leaves an intent without its
  done: those items are "perhaps removed", and undo puts back those that are gone);
- `undo`: which items an undo put back, and which it refused and why (a second undo finds nothing to do).

Bounded: past MAX_BYTES the file becomes `.journal.1` (the one before is dropped), and a `.journal.1` older
than MAX_AGE goes; so the journal never holds more than twice MAX_BYTES. A line cut by a writer that died is
skipped by the reader.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.state.store import Store

from cni_reaper import jsonio
from cni_reaper.files import open_regular

NAME = ".journal"
OLD = ".journal.1"
MAX_BYTES = 32 << 20  # a sweep of 1,000 dead attachments journals about 5 MB: several fit before a rotation
MAX_AGE = 30 * 86400.0
BATCH = 256  # items per intent at most, when many go at once (one fsync per intent, not per item)
BATCH_BYTES = 1 << 20  # and about this many bytes: a record may be large, a line stays far below MAX_BYTES


def batches(items: list[dict[str, Any]]) -> list[tuple[int, int, list[str]]]:
    """The slices (start, end) of `items` to journal as one intent each, with their items as JSON (made once:
    what sizes the batches is what the intent writes)."""
    dumped = [jsonio.dumps_raw(item) for item in items]
    out, start, size = [], 0, 0
    for i, text in enumerate(dumped):
        n = len(text)
        if i > start and (i - start >= BATCH or size + n > BATCH_BYTES):
            out.append((start, i, dumped[start:i]))
            start, size = i, 0
        size += n
    if start < len(items):
        out.append((start, len(items), dumped[start:]))
    return out


class Journal:
    """The journal of one state directory; writes are made while its lock is held."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._n = 0

    def _id(self) -> str:
        self._n += 1
        return f"{time.time():.6f}-{os.getpid()}-{self._n}"

    def _append(self, event: dict[str, Any], items: list[str] | None = None) -> None:
        """One line, fsynced; `items`: the event's items as JSON already (batches)."""
        sd = self.store.dir
        text = jsonio.dumps_raw(event)
        if items is not None:
            text = text[:-1] + ',"items":[' + ",".join(items) + "]}"
        line = text.encode() + b"\n"
        try:
            st = os.stat(NAME, dir_fd=sd.dfd, follow_symlinks=False)
            if st.st_size + len(line) > MAX_BYTES:
                sd.rename(NAME, OLD)
        except FileNotFoundError:
            pass
        fd = open_regular(NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600, dir_fd=sd.dfd)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def intent(self, verb: str, items: list[dict[str, Any]], dumped: list[str] | None = None) -> str:
        """Note what is about to be removed (`dumped`: the items as JSON, when batches() made it); returns the
        intent's id. Raises OSError when it cannot be noted: then nothing may be removed."""
        event_id = self._id()
        if dumped is None:
            self._append({"t": "intent", "id": event_id, "at": time.time(), "verb": verb, "items": items})
        else:
            self._append({"t": "intent", "id": event_id, "at": time.time(), "verb": verb}, dumped)
        return event_id

    def done(self, event_id: str, removed: list[int]) -> None:
        try:
            self._append({"t": "done", "id": event_id, "at": time.time(), "removed": removed})
        except OSError:
            pass  # the intent stands: those items are "perhaps removed"

    def undone(self, event_id: str, restored: list[list[Any]], refused: list[list[Any]],
               settled: list[list[Any]] | None = None) -> None:
        """An undo: what it put back, what it refused (and why: asked again next time), and what can never be
        put back (settled: not asked again)."""
        self._append({"t": "undo", "id": event_id, "at": time.time(), "restored": restored, "refused": refused,
                      "settled": settled or []})


def read(store: Store) -> list[dict[str, Any]]:
    """Every event of the journal, oldest first (a cut or damaged line is skipped)."""
    sd = store.dir
    try:
        st = os.stat(OLD, dir_fd=sd.dfd, follow_symlinks=False)
        if time.time() - st.st_mtime > MAX_AGE and not sd.read_only:
            sd.unlink(OLD)
    except FileNotFoundError:
        pass
    out: list[dict[str, Any]] = []
    for name in (OLD, NAME):
        data, _ = sd.read(name, 2 * MAX_BYTES)
        for line in (data or b"").splitlines():
            try:
                event = jsonio.loads(line)
            except (ValueError, RecursionError, UnicodeDecodeError):
                continue
            if isinstance(event, dict) and isinstance(event.get("id"), str) and event.get("t") in ("intent", "done", "undo"):
                out.append(event)
    return out


class Removed:
    """One removed item as the journal tells it: which intent, which item, whether it is surely removed
    (a `done` says so) or perhaps (a crash came between), and whether an undo put it back already."""

    __slots__ = ("at", "event", "index", "item", "restored", "sure", "verb")

    def __init__(self, event: dict[str, Any], index: int, item: dict[str, Any]) -> None:
        self.event, self.index, self.item = event["id"], index, item
        at, verb = event.get("at"), event.get("verb")
        self.at = at if isinstance(at, (int, float)) and not isinstance(at, bool) else 0
        self.verb = verb if isinstance(verb, str) else ""
        self.sure = False
        self.restored = False


def items(store: Store, container_id: str | None = None) -> list[Removed]:
    """The removed items, oldest first, of one container (or all)."""
    entries: dict[tuple[str, int], Removed] = {}
    for event in read(store):
        if event["t"] == "intent":
            _intended(entries, event, container_id)
        elif event["t"] == "done":
            for i in event.get("removed") or []:
                if (event["id"], i) in entries:
                    entries[(event["id"], i)].sure = True
        else:
            for ref in [*(event.get("restored") or []), *(event.get("settled") or [])]:
                if isinstance(ref, list) and len(ref) >= 2 and (ref[0], ref[1]) in entries:
                    entries[(ref[0], ref[1])].restored = True
    return list(entries.values())


def _intended(entries: dict[tuple[str, int], Removed], event: dict[str, Any], container_id: str | None) -> None:
    """The items an intent names (of `container_id`, or all), into `entries`."""
    for i, item in enumerate(event.get("items") or []):
        key = item.get("key") if isinstance(item, dict) else None
        if isinstance(key, list) and len(key) == 3 and (container_id is None or key[1] == container_id):
            entries[(event["id"], i)] = Removed(event, i, item)
