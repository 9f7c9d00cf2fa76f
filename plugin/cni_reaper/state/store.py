"""The state directory: one record file per attachment, written atomically, guarded by one flock.

Rules:
- the directory is 0700 and ours; it is opened with O_NOFOLLOW and every file in it is reached through
  that directory's fd (dir_fd=...), never through a path built from input;
- a record's file name is a hash of its key (network, container ID, ifname), so no input becomes a path;
- writes go to a temp file that is fsynced, renamed over the record, and the directory fsynced;
- a record that is not a regular file of ours, or does not parse, is renamed aside as `*.corrupt`;
- `.index` holds, per record file, what deciding whether anything is stale takes (its key, its netns and the
  namespace's identity, its tombstone, whether it has earlier lives) and the file's inode. It is a cache: a
  scan of the directory (names and inodes, no stat, no read) validates it, and when anything disagrees it is
  made anew from the records. Every save and removal under the lock keeps it current, so with nothing stale
  a verb reads one small file instead of every record (README, Performance);
- `.metrics` holds the clean-ups' counters (metrics.py), written only by a clean-up.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from cni_reaper import jsonio, log
from cni_reaper.errors import IO_FAILURE, TRY_AGAIN_LATER, CniError
from cni_reaper.state.locking import flock_within

LOCK_NAME = ".lock"
INDEX_NAME = ".index"
JOURNAL_NAME = ".index-journal"  # changes since the index was last written whole, one JSON line each
JOURNAL_MAX = 64  # lines, before the index is written whole again
INDEX_VERSION = 2
TMP_PREFIX = ".tmp."
RECORD_PREFIX = "r-"
RECORD_SUFFIX = ".json"
CORRUPT_SUFFIX = ".corrupt"
MAX_RECORD_BYTES = 1 << 20


try:  # the builtin digest module: hashlib would load OpenSSL, a few ms on every invocation
    from _sha256 import sha256
except ImportError:  # Python 3.12+
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256


# An index entry: [record file inode, network, containerID, ifname, netns path, netns dev, netns ino,
# tombstone time (epoch) or None, tombstone's verify, has earlier lives, the current life's addresses]
ENTRY_FIELDS = 11


def index_entry(record: dict, ino: int) -> list:
    from cni_reaper.state.record import iso_to_epoch

    cur, dead = record["current"], record["deleted"]
    ns = cur["netnsId"] or {"dev": None, "ino": None}
    return [ino, record["network"], record["containerID"], record["ifname"], cur["netns"], ns["dev"], ns["ino"],
            iso_to_epoch(dead["at"]) if dead is not None else None,
            dead.get("verify", True) if dead is not None else False, bool(record["earlier"]),
            sorted(ip["address"] for ip in cur["ips"])]


def record_name(network: str, container_id: str, ifname: str) -> str:
    digest = sha256(f"{network}\0{container_id}\0{ifname}".encode()).hexdigest()[:40]
    return f"{RECORD_PREFIX}{digest}{RECORD_SUFFIX}"


class Store:
    def __init__(self, root: str, lock_timeout: float = 10.0) -> None:
        self.root = root
        self.lock_timeout = lock_timeout
        self._dfd: int | None = None
        self._index: dict[str, list] | None = None  # record file name -> entry (see index()), while locked
        self._journal_lines = 0
        self._pending: list[bytes] = []  # journal lines of a batch of removals, written at sync()
        self._read_only = False

    # -- directory -------------------------------------------------------------------------------
    def open(self, create: bool = True, read_only: bool = False) -> Store:
        """Open (with `create`, make) the directory. `read_only`: only to read (list, metrics, doctor): a
        mode other than 0700 is left as it is (a writer sets it)."""
        if self._dfd is not None:
            return self
        self._read_only = read_only
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            dfd = os.open(self.root, flags)
        except FileNotFoundError:
            if not create:
                raise CniError(IO_FAILURE, f"state directory {self.root} does not exist") from None
            try:
                os.makedirs(os.path.dirname(self.root.rstrip("/")) or "/", mode=0o755, exist_ok=True)
                os.mkdir(self.root, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise CniError(
                    IO_FAILURE,
                    f"cannot create state directory {self.root}: {exc.strerror}",
                    "create it (mode 0700, owned by root) or set stateDir in the conflist to a writable path",
                ) from None
            return self.open(create=False, read_only=read_only)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CniError(
                    IO_FAILURE,
                    f"state directory {self.root} is a symlink or not a directory; refusing to use it",
                    "point stateDir at a real directory owned by root",
                ) from None
            raise CniError(IO_FAILURE, f"cannot open state directory {self.root}: {exc.strerror}") from None
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            os.close(dfd)
            raise CniError(
                IO_FAILURE,
                f"state directory {self.root} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()}); "
                "refusing to use it",
                "chown it to root, or set stateDir to a directory of root's",
            )
        if stat.S_IMODE(st.st_mode) != 0o700 and not read_only:
            try:
                os.fchmod(dfd, 0o700)
            except OSError as exc:
                os.close(dfd)
                raise CniError(IO_FAILURE, f"cannot set mode 0700 on {self.root}: {exc.strerror}") from None
        self._dfd = dfd
        return self

    def close(self) -> None:
        if self._dfd is not None:
            os.close(self._dfd)
            self._dfd = None

    @property
    def dfd(self) -> int:
        if self._dfd is None:
            self.open()
        assert self._dfd is not None
        return self._dfd

    # -- lock ------------------------------------------------------------------------------------
    def locked(self) -> _Locked:
        """Hold the state lock (a context manager); give up after lock_timeout seconds with CNI error 11.
        Once held, temp files of a writer that died are gone and the index is valid (index())."""
        return _Locked(self)

    # -- records ---------------------------------------------------------------------------------
    def load_named(self, name: str):
        """The record in file `name` (an index key), or None."""
        return self._load_name(name)

    def load(self, network: str, container_id: str, ifname: str):
        return self._load_name(record_name(network, container_id, ifname), expect=(network, container_id, ifname))

    def _load_name(self, name: str, expect: tuple[str, str, str] | None = None):
        """The record in file `name` as a dict (see record.py), or None; an unusable file is moved aside."""
        from cni_reaper.state.record import key
        from cni_reaper.state.record import problem as record_problem

        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._quarantine(name, f"cannot open: {exc.strerror}")
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                problem = "not a regular file"
            elif st.st_uid != os.geteuid():
                problem = f"owned by uid {st.st_uid}"
            elif st.st_mode & 0o022:
                problem = "writable by group or others"
            elif st.st_size > MAX_RECORD_BYTES:
                problem = f"too large ({st.st_size} bytes)"
            else:
                problem = None
            data = b"" if problem else os.read(fd, st.st_size + 1)  # not a 1 MiB buffer per record
        finally:
            os.close(fd)
        if problem is None:
            try:
                record = jsonio.loads(data)
            except (ValueError, RecursionError) as exc:
                problem = f"does not parse: {str(exc)[:200]}"
            else:
                problem = record_problem(record)
                if problem is None:
                    if record_name(*key(record)) != name or (expect is not None and key(record) != expect):
                        problem = "holds another attachment's key"
                    else:
                        return record
        self._quarantine(name, problem)
        return None

    def save(self, record: dict) -> None:
        name = record_name(record["network"], record["containerID"], record["ifname"])
        tmp = f"{TMP_PREFIX}{name}.{os.getpid()}"
        data = jsonio.dumps(record).encode() + b"\n"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
                ino = os.fstat(fd).st_ino  # the record's, once renamed
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
            os.fsync(self.dfd)
        except OSError as exc:
            try:
                os.unlink(tmp, dir_fd=self.dfd)
            except OSError:
                pass
            raise CniError(IO_FAILURE, f"cannot write record in {self.root}: {exc.strerror}",
                           "check free space and permissions of the state directory") from None
        if self._index is not None:
            self._change(name, index_entry(record, ino))

    def remove(self, network: str, container_id: str, ifname: str, sync: bool = True) -> None:
        """Delete a record; with sync=False the caller calls sync() once after a batch of removals."""
        name = record_name(network, container_id, ifname)
        try:
            os.unlink(name, dir_fd=self.dfd)
        except FileNotFoundError:
            return
        finally:
            if self._index is not None and name in self._index:
                self._change(name, None, write=sync)
        if sync:
            os.fsync(self.dfd)

    def sync(self) -> None:
        """Make removals durable (and the index current)."""
        os.fsync(self.dfd)
        if self._index is not None and self._pending:
            self._append(b"".join(self._pending), len(self._pending))
        self._pending = []

    # -- the index: what deciding "is anything stale" takes, per record, without reading the records ------
    def index(self) -> dict[str, list]:
        """record file name -> entry (index_entry), valid for the directory as it is: checked against one scan
        of it (names and inodes), made anew from the records when anything disagrees. The caller holds the
        lock; the index then stays current through save() and remove()."""
        if self._index is not None:
            return self._index
        found = {}
        for e in os.scandir(self.dfd):
            if e.name.startswith(RECORD_PREFIX) and e.name.endswith(RECORD_SUFFIX):
                found[e.name] = e.inode()
            elif e.name.startswith(TMP_PREFIX):
                try:  # only a writer that died leaves one: we hold the lock, no one else is writing
                    os.unlink(e.name, dir_fd=self.dfd)
                except OSError:
                    pass
        cached = self._read_index()
        if cached is not None and len(cached) == len(found) and all(
                found.get(name) == entry[0] for name, entry in cached.items()):
            self._index = cached
            if self._journal_lines > JOURNAL_MAX:
                self._write_index()
            return cached
        index = {}
        for name in sorted(found):
            record = self._load_name(name)
            if record is not None:
                index[name] = index_entry(record, found[name])
        self._index = index
        self._write_index()
        return index

    def _read_file(self, name: str) -> bytes | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.dfd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > MAX_RECORD_BYTES * 64:
                return None
            return os.read(fd, st.st_size + 1)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _read_index(self) -> dict[str, list] | None:
        """The index as last written whole, with the journal's changes applied; None when either is unusable."""
        data = self._read_file(INDEX_NAME)
        try:
            doc = jsonio.loads(data) if data is not None else None
        except (ValueError, RecursionError):
            return None
        if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION or not isinstance(doc.get("entries"), dict):
            return None
        entries = doc["entries"]
        journal = self._read_file(JOURNAL_NAME) or b""
        lines = journal.splitlines()
        self._journal_lines = len(lines)
        try:
            for line in lines:
                name, entry = jsonio.loads(line)
                if entry is None:
                    entries.pop(name, None)
                else:
                    entries[name] = entry
        except (ValueError, TypeError, RecursionError):
            return None  # a line cut by a writer that died: made anew
        if not all(isinstance(e, list) and len(e) == ENTRY_FIELDS and isinstance(e[0], int) for e in entries.values()):
            return None
        return entries

    def _change(self, name: str, entry: list | None, write: bool = True) -> None:
        """One record saved (entry) or removed (None): the index in memory, and one line in the journal (an
        ADD writes a line, not the whole index). With write=False, sync() writes the index later."""
        assert self._index is not None
        if entry is None:
            self._index.pop(name, None)
        else:
            self._index[name] = entry
        line = jsonio.dumps([name, entry]).encode() + b"\n"
        if write:
            self._append(line, 1)
        else:
            self._pending.append(line)

    def _append(self, lines: bytes, count: int) -> None:
        if self._journal_lines + count > JOURNAL_MAX:
            self._write_index()
            return
        try:
            fd = os.open(JOURNAL_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self.dfd)
            try:
                os.write(fd, lines)
            finally:
                os.close(fd)
            self._journal_lines += count
        except OSError:
            self._write_index()

    def _write_index(self) -> None:
        """The index written whole, and the journal emptied. Not fsynced: a lost or stale index is found out
        and made anew (index())."""
        data = jsonio.dumps({"version": INDEX_VERSION, "entries": self._index}).encode()
        if self.write_aux(INDEX_NAME, data):
            try:
                os.unlink(JOURNAL_NAME, dir_fd=self.dfd)
            except FileNotFoundError:
                pass
            self._journal_lines = 0

    # -- files of the directory's own beside the records (.index, .metrics) ---------------------------
    def read_aux(self, name: str) -> bytes | None:
        """One of the directory's own files, or None when it is missing or not a regular file of ours."""
        return self._read_file(name)

    def write_aux(self, name: str, data: bytes, durable: bool = False) -> bool:
        """Replace one of the directory's own files atomically (temp file, rename); fsynced with `durable`.
        The caller holds the lock. False (and nothing changed) when it could not be written."""
        tmp = f"{TMP_PREFIX}{name}.{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self.dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
            return True
        except OSError:
            try:
                os.unlink(tmp, dir_fd=self.dfd)
            except OSError:
                pass
            return False

    def names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.dfd) if n.startswith(RECORD_PREFIX) and n.endswith(RECORD_SUFFIX))

    def records(self):
        for name in self.names():
            record = self._load_name(name)
            if record is not None:
                yield record

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.dfd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def _quarantine(self, name: str, problem: str) -> None:
        if self._read_only:  # a reader skips it; the next writer moves it aside
            return
        if self._index is not None:
            self._index.pop(name, None)
        target = name + CORRUPT_SUFFIX
        try:
            if self._exists(target):
                target = f"{name}.{int(time.time() * 1000)}{CORRUPT_SUFFIX}"
            os.rename(name, target, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
            log.warn("record quarantined", record=name, moved_to=target, problem=problem)
        except OSError as exc:
            log.warn("record unusable and could not be moved aside", record=name, problem=problem, error=exc.strerror)


class _Locked:
    """The state lock as a context manager (a class: contextlib costs milliseconds to import)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.fd = -1

    def __enter__(self) -> Store:
        st = self.store
        try:
            self.fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=st.dfd)
        except OSError as exc:
            raise CniError(IO_FAILURE, f"cannot open lock file in {st.root}: {exc.strerror}") from None
        try:
            if not flock_within(self.fd, st.lock_timeout):
                raise CniError(TRY_AGAIN_LATER, f"state directory {st.root} is locked by another cni-reaper",
                               f"waited {st.lock_timeout:g}s; retry the operation")
            st.index()
        except BaseException:
            os.close(self.fd)
            raise
        return st

    def __exit__(self, *exc) -> None:
        self.store._index = None  # valid only while the lock is held
        self.store._pending = []
        os.close(self.fd)  # closing the fd releases the flock
