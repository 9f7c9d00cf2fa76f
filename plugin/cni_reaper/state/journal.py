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

Written whole or not at all: a line is appended in as many writes as it takes, then fsynced; when that fails
(a full file system), what was written of it is cut off again and the caller is told (OSError), so nothing of
the clean-up is removed unjournaled. A line a writer that died cut short is ended before the next is appended,
so that the reader skips it alone.

Kept a month: past MAX_BYTES the file becomes `.journal.1` and each older generation moves one up, up to
`.journal.8` (GENERATIONS); a generation older than MAX_AGE goes when the journal is read. Bounded all the
same: at most GENERATIONS + 1 files of MAX_BYTES (288 MiB); a busy client that fills them in less than a month
drops the oldest generation early, and the log says so.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.state.store import Store

from cni_reaper import jsonio
from cni_reaper.files import open_regular, untrusted

NAME = ".journal"
GENERATIONS = 8  # .journal.1 (the newest rotated) to .journal.8
OLD = ".journal.1"
MAX_BYTES = 32 << 20  # a sweep of 1,000 dead attachments journals about 5 MB: several fit before a rotation
MAX_AGE = 30 * 86400.0


def generation(n: int) -> str:
    """The name of the journal's `n`th generation (0: the one written)."""
    return f"{NAME}.{n}" if n else NAME
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
        """One line, written whole and fsynced, or not at all (OSError); `items`: the event's items as JSON
        already (batches)."""
        text = jsonio.dumps_raw(event)
        if items is not None:
            text = text[:-1] + ',"items":[' + ",".join(items) + "]}"
        line = text.encode() + b"\n"
        self._rotate(len(line))
        fd = open_regular(NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600, dir_fd=self.store.dir.dfd)
        try:
            st = os.fstat(fd)
            why = untrusted(st, f"{self.store.root}/{NAME}")
            if why:  # what undo would put back must be what cni-reaper wrote
                raise OSError(0, f"{why}: the journal is refused")
            size = st.st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a line cut short by a writer that died stays a line of its own
            try:
                _write_all(fd, line)
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # nothing of it stays: an intent is whole or not there
                raise
        finally:
            os.close(fd)

    def _rotate(self, adding: int) -> None:
        """Past MAX_BYTES, the file becomes the first generation and the older ones move up; the last goes."""
        sd = self.store.dir
        try:
            st = os.stat(NAME, dir_fd=sd.dfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if st.st_size + adding <= MAX_BYTES:
            return
        try:
            last = os.stat(generation(GENERATIONS), dir_fd=sd.dfd, follow_symlinks=False)
            if time.time() - last.st_mtime < MAX_AGE:
                from cni_reaper import log

                log.warn("the journal's oldest generation goes before it is a month old: clean-ups journal more "
                         f"than {GENERATIONS + 1} x {MAX_BYTES >> 20} MiB a month here",
                         file=f"{sd.root}/{generation(GENERATIONS)}")
        except FileNotFoundError:
            pass
        for n in range(GENERATIONS - 1, -1, -1):
            try:
                sd.rename(generation(n), generation(n + 1))
            except FileNotFoundError:
                continue

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
    """Every event of the journal, oldest first (a cut or damaged line is skipped); generations older than
    MAX_AGE go."""
    out: list[dict[str, Any]] = []
    for data in _generations(store):
        for line in data.splitlines():
            try:
                event = jsonio.loads(line)
            except (ValueError, RecursionError, UnicodeDecodeError):
                continue
            if isinstance(event, dict) and isinstance(event.get("id"), str) and event.get("t") in ("intent", "done", "undo"):
                out.append(event)
    return out


def _generations(store: Store) -> list[bytes]:
    """The generations' bytes, oldest first, as one moment saw them: a reader without the state lock (`journal`)
    reads them again when a clean-up rotated them meanwhile (`.journal` became `.journal.1`: what it had not
    read yet would be missed), a few times at most."""
    sd = store.dir
    for _ in range(READ_TRIES):
        before = _inodes(store)
        datas = []
        for n in range(GENERATIONS, -1, -1):
            name = generation(n)
            if n and not sd.read_only and _older_than_kept(store, name):
                sd.unlink(name)
                continue
            data, _ = sd.read(name, 2 * MAX_BYTES)
            datas.append(data or b"")
        if _inodes(store) == before:
            break
    return datas


READ_TRIES = 5


def _inodes(store: Store) -> list[int]:
    found = []
    for n in range(GENERATIONS + 1):
        try:
            found.append(os.stat(generation(n), dir_fd=store.dir.dfd, follow_symlinks=False).st_ino)
        except OSError:
            found.append(0)
    return found


def _older_than_kept(store: Store, name: str) -> bool:
    try:
        return time.time() - os.stat(name, dir_fd=store.dir.dfd, follow_symlinks=False).st_mtime > MAX_AGE
    except FileNotFoundError:
        return False


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` (a short write is continued; a write that makes no progress is ENOSPC)."""
    import errno

    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


class Removed:
    """One removed item as the journal tells it: which intent, which item, whether it is surely removed
    (a `done` says so) or perhaps (a crash came between), and whether an undo put it back already."""

    __slots__ = ("at", "event", "index", "item", "restored", "sure", "verb")

    def __init__(self, event: dict[str, Any], index: int, item: dict[str, Any]) -> None:
        self.event, self.index, self.item = event["id"], index, item
        at, verb = event.get("at"), event.get("verb")
        # a time, finite (NaN and infinities are no JSON; `at - at` is 0 for a finite number alone)
        self.at = at if isinstance(at, (int, float)) and not isinstance(at, bool) and at - at == 0 else 0
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
            for e in _named(entries, [[event["id"], i] for i in event.get("removed") or []]):
                e.sure = True
        else:
            for e in _named(entries, [*(event.get("restored") or []), *(event.get("settled") or [])]):
                e.restored = True
    return list(entries.values())


def _named(entries: dict[tuple[str, int], Removed], refs: list[Any]) -> list[Removed]:
    """The entries that references ([event id, index, ...]) name."""
    return [entries[(ref[0], ref[1])] for ref in refs
            if isinstance(ref, list) and len(ref) >= 2 and (ref[0], ref[1]) in entries]


def _intended(entries: dict[tuple[str, int], Removed], event: dict[str, Any], container_id: str | None) -> None:
    """The items an intent names (of `container_id`, or all), into `entries`."""
    for i, item in enumerate(event.get("items") or []):
        key = item.get("key") if isinstance(item, dict) else None
        if isinstance(key, list) and len(key) == 3 and (container_id is None or key[1] == container_id):
            entries[(event["id"], i)] = Removed(event, i, item)
