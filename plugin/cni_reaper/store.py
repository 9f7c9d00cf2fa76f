"""The state directory: one record file per attachment, written atomically, guarded by one flock.

Rules:
- the directory is 0700 and ours; it is opened with O_NOFOLLOW and every file in it is reached through
  that directory's fd (dir_fd=...), never through a path built from input;
- a record's file name is a hash of its key (network, container ID, ifname), so no input becomes a path;
- writes go to a temp file that is fsynced, renamed over the record, and the directory fsynced;
- a record that is not a regular file of ours, or does not parse, is renamed aside as `*.corrupt`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time

from . import log
from .errors import IO_FAILURE, TRY_AGAIN_LATER, CniError
from .locking import flock_within

LOCK_NAME = ".lock"
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


def record_name(network: str, container_id: str, ifname: str) -> str:
    digest = sha256(f"{network}\0{container_id}\0{ifname}".encode()).hexdigest()[:40]
    return f"{RECORD_PREFIX}{digest}{RECORD_SUFFIX}"


class Store:
    def __init__(self, root: str, lock_timeout: float = 10.0) -> None:
        self.root = root
        self.lock_timeout = lock_timeout
        self._dfd: int | None = None

    # -- directory -------------------------------------------------------------------------------
    def open(self, create: bool = True) -> Store:
        if self._dfd is not None:
            return self
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
            return self.open(create=False)
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
        if stat.S_IMODE(st.st_mode) != 0o700:
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
        """Hold the state lock (a context manager); give up after lock_timeout seconds with CNI error 11."""
        return _Locked(self)

    def _remove_debris(self) -> None:
        """Temp files can only be left by a writer that died: we hold the lock, no one else is writing."""
        for name in os.listdir(self.dfd):
            if name.startswith(TMP_PREFIX):
                try:
                    os.unlink(name, dir_fd=self.dfd)
                except OSError:
                    pass

    # -- records ---------------------------------------------------------------------------------
    def load(self, network: str, container_id: str, ifname: str):
        return self._load_name(record_name(network, container_id, ifname), expect=(network, container_id, ifname))

    def _load_name(self, name: str, expect: tuple[str, str, str] | None = None):
        """The record in file `name` as a dict (see record.py), or None; an unusable file is moved aside."""
        from .record import key
        from .record import problem as record_problem

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
                record = json.loads(data)
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
        data = json.dumps(record, indent=1).encode() + b"\n"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
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

    def remove(self, network: str, container_id: str, ifname: str, sync: bool = True) -> None:
        """Delete a record; with sync=False the caller calls sync() once after a batch of removals."""
        try:
            os.unlink(record_name(network, container_id, ifname), dir_fd=self.dfd)
        except FileNotFoundError:
            return
        if sync:
            self.sync()

    def sync(self) -> None:
        os.fsync(self.dfd)

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
            st._remove_debris()
        except BaseException:
            os.close(self.fd)
            raise
        return st

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing the fd releases the flock
