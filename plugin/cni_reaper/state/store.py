"""The records of one state directory: one file per attachment, named by a hash of its key (network,
container ID, ifname: state/names.py), so that no input becomes a path; written atomically and durably (state/safedir.py);
read back only when they are regular files of ours that the record check accepts, else moved aside as
`*.corrupt` with a log line (never a crash, never a verb failed for another attachment's file); one flock
serialises writers, with a bounded wait; the index (state/index.py) is valid while it is held.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.state.index import QuickView
    from cni_reaper.state.record import Record

from cni_reaper import jsonio, log
from cni_reaper.errors import IO_FAILURE, TRY_AGAIN_LATER, CniError
from cni_reaper.files import flock_within, holding
from cni_reaper.state.index import Damaged, Entry, Index
from cni_reaper.state.names import MAX_RECORD_BYTES, Attached, is_record_name, others_in, record_name
from cni_reaper.state.record import key_of, later_schema, of_document, problem, written_as_read
from cni_reaper.state.safedir import SafeDir
from cni_reaper.values import Key

LOCK_NAME = ".lock"
# how long a CNI verb (ADD, CHECK, DEL) waits for the state lock before its answer; past it (another process holds
# it: an operator's long sweep, a burst of calls), its bookkeeping runs after the answer (cni/afterwards.py),
# waiting lockTimeout there: no allocation waits on another process's hold
BRIEF_WAIT = 1.0
CORRUPT_SUFFIX = ".corrupt"


class Store:
    def __init__(self, root: str, lock_timeout: float = 10.0) -> None:
        self.dir = SafeDir(root)
        self.lock_timeout = lock_timeout
        self.index: Index | None = None  # while locked
        self.waited = 0.0  # how long the last lock() waited
        self._read: dict[int, tuple[Record, jsonio.Raw]] = {}  # id(record) -> (it, its document as read): as_read()
        self._later: set[str] = set()  # names of the records of a later schema read: never rewritten or removed here

    @property
    def root(self) -> str:
        return self.dir.root

    def open(self, create: bool = True, read_only: bool = False) -> Store:
        self.dir.open(create=create, read_only=read_only)
        return self

    def close(self) -> None:
        self.dir.close()

    def locked(self, wait: float | None = None) -> _Locked:
        """Hold the state lock (a context manager); give up after `wait` seconds (lock_timeout by default) with
        CNI error 11. Once held, temp files of a writer that died are gone and the index is valid. The tools run
        while it is held are bounded by lock_timeout's hold (files.holding) whatever `wait` is."""
        return _Locked(self, self.lock_timeout if wait is None else min(wait, self.lock_timeout))

    @classmethod
    def session(cls, root: str, lock_timeout: float = 10.0, create: bool = True, wait: float | None = None) -> _Session:
        """The state directory opened and its lock held, for a `with` block (a verb's whole use of it): let go and
        closed when the block ends, whatever happens in it."""
        return _Session(cls(root, lock_timeout), create, wait)

    # -- records -------------------------------------------------------------------------------------
    def load(self, network: str, container_id: str, ifname: str) -> Record | None:
        return self.load_named(record_name(network, container_id, ifname), expect=Key(network, container_id, ifname))

    def load_named(self, name: str, expect: Key | None = None) -> Record | None:
        """The record in file `name` (in schema 3's shape, as every record is held), or None; an unusable file is
        moved aside."""
        data, why = self.dir.read(name, MAX_RECORD_BYTES)
        if data is None:
            if why is not None:
                self._quarantine(name, why)
            return None
        try:
            record = jsonio.loads(data)
        except (ValueError, RecursionError, UnicodeDecodeError) as exc:
            self._quarantine(name, f"does not parse: {str(exc)[:200]}")
            return None
        if later_schema(record) is not None:  # a rollback: kept as it is, judged unknown, never rewritten here
            self._later.add(name)
            return _later(record, name)
        why = problem(record)
        if why is None and (record_name(*key_of(record)) != name or (expect is not None and key_of(record) != expect)):
            why = "holds another attachment's key"
        if why is not None:
            self._quarantine(name, why)
            return None
        out = of_document(record)
        if written_as_read(record):
            text = data.decode("utf-8", "replace").rstrip("\n")
            if jsonio.raw_line(text):
                self._read[id(out)] = (out, jsonio.Raw(text, record))
        return out

    def as_read(self, record: Record) -> Any:
        """A record's document for the journal: the text it was read from when this store read it so (jsonio.Raw:
        the journal writes it as it is instead of encoding it again), else its document."""
        found = self._read.get(id(record))
        return found[1] if found is not None and found[0] is record else record.written(stamped=False)

    def save(self, record: Record) -> bool:
        """Write the record (durably) and index it. False: nothing written, a later cni-reaper's record is there
        (kept as it is)."""
        name = record_name(*record.key)
        if self._kept_as_later(name):
            return False
        data = jsonio.dumps(record.written()).encode() + b"\n"
        if len(data) > MAX_RECORD_BYTES:  # the builders' limits make this impossible; never write what we would refuse
            raise CniError(IO_FAILURE, f"record of {record.container_id} too large ({len(data)} bytes)")
        try:
            ino = self.dir.write(name, data, durable=True, exclusive_tmp=True)
        except OSError as exc:
            raise CniError(IO_FAILURE, f"cannot write record in {self.root}: {exc.strerror}",
                           "check free space and permissions of the state directory") from None
        if self.index is not None:
            self.index.set(name, Entry.of_record(record, ino))
        return True

    def remove(self, network: str, container_id: str, ifname: str, sync: bool = True) -> None:
        """Delete a record; with sync=False the caller calls sync() once after a batch of removals."""
        name = record_name(network, container_id, ifname)
        if self._kept_as_later(name):
            return
        gone = self.dir.unlink(name)
        if self.index is not None and name in self.index.inos:
            self.index.set(name, None, write=sync)
        if gone and sync:
            self.dir.sync()

    def _kept_as_later(self, name: str) -> bool:
        """Whether `name` was read as a later cni-reaper's record: whatever this one would write or remove of it
        is left undone (a rollback; the later release has its own word on it)."""
        if name not in self._later:
            return False
        log.info("a record of a later cni-reaper is kept as it is", record=name)
        return True

    def remove_all(self, keys: list[Key]) -> list[OSError | None]:
        """Delete these records side by side (pool.each: a sweep drops a thousand); the index learns of every one
        that is gone. Per key, None (gone, or there was none) or the OSError that kept it. sync() after."""
        from cni_reaper.state import pool

        names = [record_name(*k) for k in keys]
        errors = pool.each(lambda n: None if self._kept_as_later(n) else self.dir.unlink_or_error(n), names)
        if self.index is not None:
            for name, error in zip(names, errors):
                if error is None and name in self.index.inos and name not in self._later:
                    self.index.set(name, None, write=False)
        return errors

    def sync(self) -> None:
        """Make removals durable (and the index current)."""
        self.dir.sync()
        if self.index is not None:
            self.index.flush()

    def names(self) -> list[str]:
        return sorted(n for n in self.dir.scan() if is_record_name(n))

    def records(self):
        for name in self.names():
            record = self.load_named(name)
            if record is not None:
                yield record

    def entries(self, but: set[str] | None = None) -> dict[str, Entry]:
        """The index (the caller holds the lock): every record file's entry, or every one but those named."""
        assert self.index is not None, "the index is valid only under the state lock"
        try:
            return self.index.entries_but(but) if but else self.index.entries
        except Damaged as exc:  # torn, or entries it cannot make: the records say it all, and a verb never fails
            log.warn("index unusable; made anew from the records", problem=str(exc)[:200])
            self.index = self._index_from_records(Index(self.dir), self.dir.scan())
            return self.index.entries_but(but) if but else self.index.entries

    def attached(self) -> Attached:
        """The records as libcni names attachments (Index.attached; the caller holds the lock)."""
        assert self.index is not None, "the index is valid only under the state lock"
        return self.index.attached()

    def quick(self) -> QuickView:
        """What the quick judgement reads of the entries it can judge (Index.quick_view)."""
        assert self.index is not None, "the index is valid only under the state lock"
        return self.index.quick_view()

    # -- the index under the lock ----------------------------------------------------------------
    def _load_index(self) -> None:
        found = self.dir.scan()
        index = Index(self.dir)
        try:
            loaded = index.load(found)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:  # a verb never fails for it
            log.warn("index unusable; made anew from the records", problem=f"{type(exc).__name__}: {exc}"[:200])
            index, loaded = Index(self.dir), False
        others = index.others if index.others is not None else others_in(found)
        self.dir.sweep_temps(others)
        for n in others:
            del found[n]
        self.index = index if loaded else self._index_from_records(index, found)

    def _index_from_records(self, index: Index, found: dict[str, int]) -> Index:
        """`index` (empty) filled from the record files among `found` (name -> inode), and written whole."""
        self.index = index
        others = set(others_in(found))
        for name in sorted(n for n in found if n not in others):
            record = self.load_named(name)
            if record is None:
                continue
            try:
                index.put(name, Entry.of_record(record, found[name]))
            except (KeyError, TypeError, ValueError) as exc:  # the check let through what a reader cannot read
                self._quarantine(name, f"cannot be indexed: {exc}")
        index.write_whole()
        return index

    def _quarantine(self, name: str, why: str) -> None:
        if self.dir.read_only:  # a reader skips it; the next writer moves it aside
            return
        if self.index is not None:
            self.index.drop(name)
        target = name + CORRUPT_SUFFIX
        try:
            if self.dir.exists(target):
                target = f"{name}.{int(time.time() * 1000)}{CORRUPT_SUFFIX}"
            self.dir.rename(name, target)
            log.warn("record quarantined", record=name, moved_to=target, problem=why)
        except OSError as exc:
            log.warn("record unusable and could not be moved aside", record=name, problem=why, error=exc.strerror)


_last_index: Index | None = None


def _later(doc: dict[str, Any], name: str) -> Record | None:
    """A record of a later cni-reaper's schema (record.of_later), named by its own key; else None (it stays
    on disk as it is, unread)."""
    from cni_reaper.state.record import of_later

    record = of_later(doc)
    if record is None or record_name(*record.key) != name:
        log.warn("a record of a later cni-reaper cannot be read; left as it is", record=name, schema=later_schema(doc))
        return None
    return record


class _Locked:
    """The state lock as a context manager (a class: contextlib costs milliseconds to import)."""

    def __init__(self, store: Store, wait: float) -> None:
        self.store, self.wait = store, wait
        self.fd = -1
        self.hold = holding(store.lock_timeout, "its state lock")  # every allocation's cni-reaper waits for it

    def __enter__(self) -> Store:
        import os

        st = self.store
        try:
            # only locked, never written: whatever can be opened without blocking can be flocked (0.4.0 took a
            # FIFO there too)
            self.fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600,
                              dir_fd=st.dir.dfd)
        except OSError as exc:
            raise CniError(IO_FAILURE, f"cannot open lock file in {st.root}: {exc.strerror}",
                           f"{st.root}/{LOCK_NAME} must be a file cni-reaper can create or open: remove what is there "
                           "(nothing can be recorded without it, as host-local fails on an unusable dataDir)") from None
        try:
            started = time.monotonic()
            if not flock_within(self.fd, self.wait):
                raise CniError(TRY_AGAIN_LATER, f"state directory {st.root} is locked by another cni-reaper",
                               f"waited {self.wait:g}s; retry the operation")
            st.waited = time.monotonic() - started
            self.hold.__enter__()
            st._load_index()
        except BaseException:
            self.hold.__exit__()
            os.close(self.fd)
            raise
        return st

    def __exit__(self, *exc: object) -> None:
        import os

        global _last_index
        # valid only while the lock is held; kept until the next one is let go (freeing a thousand entries
        # costs a call with nothing stale a few tenths of a ms, and a CNI call ends with os._exit)
        _last_index, self.store.index = self.store.index, None
        self.hold.__exit__()
        os.close(self.fd)  # closing the fd releases the flock


class _Session:
    """Store.session: the directory opened, then its lock taken; the lock let go, then the directory closed."""

    def __init__(self, store: Store, create: bool, wait: float | None) -> None:
        self.store, self.create, self.wait = store, create, wait
        self.lock: _Locked | None = None

    def __enter__(self) -> Store:
        try:
            self.store.open(create=self.create)
            self.lock = self.store.locked(self.wait)
            self.lock.__enter__()
        except BaseException:
            self.store.close()
            raise
        return self.store

    def __exit__(self, *exc: object) -> None:
        try:
            if self.lock is not None:
                self.lock.__exit__(*exc)
        finally:
            self.store.close()
