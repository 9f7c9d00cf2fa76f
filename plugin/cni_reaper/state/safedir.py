"""A directory of cni-reaper's own, used safely: the one policy (ours, not a symlink, 0700) and the one way to
read and to replace its files, for the records, their index, the counters and the journal alike.

- the directory is opened with O_NOFOLLOW and every file in it is reached through its fd (dir_fd=...),
  never through a path built from input;
- a file is read only when it is a regular file of ours, not writable by group or others, and within the
  caller's size limit;
- a file is replaced atomically: a temp file (`.tmp.<name>.<pid>`) written, optionally fsynced, renamed over
  it; temp files left by a writer that died are removed by whoever holds the directory's lock (`sweep_temps`).
"""

from __future__ import annotations

import errno
import os
import stat

from cni_reaper import log
from cni_reaper.errors import IO_FAILURE, CniError
from cni_reaper.files import open_regular

TMP_PREFIX = ".tmp."
MODE = 0o700


def problem(path: str) -> str | None:
    """Why `path` cannot be used as a state directory (None when it can, or can be created): the one policy,
    asked by STATUS and doctor without opening anything."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return _uncreatable(path)
    except OSError as exc:
        return f"state directory {path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"state directory {path} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return f"state directory {path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"state directory {path} is owned by uid {st.st_uid}, not by uid {os.geteuid()}"
    if st.st_mode & 0o022:
        return f"state directory {path} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"state directory {path} is not writable"
    return None


def _uncreatable(path: str) -> str | None:
    """Why a state directory that is not there cannot be made (None: it can)."""
    parent = os.path.dirname(path.rstrip("/")) or "/"
    while not os.path.exists(parent):
        parent = os.path.dirname(parent) or "/"
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        return f"state directory {path} does not exist and cannot be created under {parent}"
    return None


class SafeDir:
    def __init__(self, root: str) -> None:
        self.root = root
        self.fd: int | None = None
        self.read_only = False

    def open(self, create: bool = True, read_only: bool = False) -> SafeDir:
        """Open (with `create`, make) the directory. `read_only`: only to read (list, metrics, doctor): a mode
        other than 0700 is left as it is (a writer sets it). CniError (5) when it cannot be used."""
        if self.fd is not None:
            return self
        self.read_only = read_only
        try:
            dfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                raise CniError(IO_FAILURE, f"state directory {self.root} does not exist") from None
            self._make()
            return self.open(create=False, read_only=read_only)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CniError(IO_FAILURE, f"state directory {self.root} is a symlink or not a directory; refusing "
                               "to use it", "point stateDir at a real directory owned by root") from None
            raise CniError(IO_FAILURE, f"cannot open state directory {self.root}: {exc.strerror}") from None
        self._check(dfd)
        self.fd = dfd
        return self

    def _make(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.root.rstrip("/")) or "/", mode=0o755, exist_ok=True)
            os.mkdir(self.root, MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise CniError(IO_FAILURE, f"cannot create state directory {self.root}: {exc.strerror}",
                           "create it (mode 0700, owned by root) or set stateDir to a writable path") from None

    def _check(self, dfd: int) -> None:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            os.close(dfd)
            raise CniError(IO_FAILURE, f"state directory {self.root} is owned by uid {st.st_uid}, not by us (uid "
                           f"{os.geteuid()}); refusing to use it",
                           "chown it to root, or set stateDir to a directory of root's")
        if st.st_mode & 0o022:  # anyone else could have put anything there: never followed
            os.close(dfd)
            raise CniError(IO_FAILURE, f"state directory {self.root} is writable by its group or others (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); refusing to use it",
                           f"chmod 0700 {self.root} once you trust what is in it, or set stateDir to a directory of root's")
        if stat.S_IMODE(st.st_mode) != MODE and not self.read_only:
            try:
                os.fchmod(dfd, MODE)
            except OSError as exc:
                os.close(dfd)
                raise CniError(IO_FAILURE, f"cannot set mode 0700 on {self.root}: {exc.strerror}") from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @property
    def dfd(self) -> int:
        if self.fd is None:
            self.open()
        assert self.fd is not None
        return self.fd

    # -- files -------------------------------------------------------------------------------------
    def read(self, name: str, limit: int) -> tuple[bytes | None, str | None]:
        """(content, None), or (None, why) when the file is missing (why None) or not one of ours."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.dfd)
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"cannot open: {exc.strerror}"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, "not a regular file"
            if st.st_uid != os.geteuid():
                return None, f"owned by uid {st.st_uid}"
            if st.st_mode & 0o022:
                return None, "writable by group or others"
            if st.st_size > limit:
                return None, f"too large ({st.st_size} bytes, the limit is {limit})"
            return os.read(fd, st.st_size + 1), None  # not a buffer of the limit's size per file
        except OSError as exc:
            return None, f"cannot read: {exc.strerror}"
        finally:
            os.close(fd)

    def write(self, name: str, data: bytes, durable: bool = False, exclusive_tmp: bool = False) -> int:
        """Replace `name` atomically; fsynced (file and directory) with `durable`. Returns the new file's inode.
        OSError when it could not be written (nothing changed then)."""
        tmp = f"{TMP_PREFIX}{name}.{os.getpid()}"
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive_tmp else os.O_TRUNC)
        try:
            fd = open_regular(tmp, flags, 0o600, dir_fd=self.dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if durable:
                    os.fsync(fd)
                ino = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
            if durable:
                os.fsync(self.dfd)
            return ino
        except OSError:
            try:
                os.unlink(tmp, dir_fd=self.dfd)
            except OSError:
                pass
            raise

    def append(self, name: str, data: bytes) -> None:
        fd = open_regular(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600, dir_fd=self.dfd)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def unlink(self, name: str) -> bool:
        try:
            os.unlink(name, dir_fd=self.dfd)
            return True
        except FileNotFoundError:
            return False

    def unlink_or_error(self, name: str) -> OSError | None:
        """unlink() that returns what kept the file (None: it is gone, or there was none)."""
        try:
            os.unlink(name, dir_fd=self.dfd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            return exc
        return None

    def rename(self, name: str, new: str) -> None:
        os.rename(name, new, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)

    def exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.dfd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def sync(self) -> None:
        os.fsync(self.dfd)

    def scan(self) -> dict[str, int]:
        """name -> inode of every entry: one getdents, no stat."""
        return {e.name: e.inode() for e in os.scandir(self.dfd)}

    def sweep_temps(self, names: list[str]) -> None:
        """Remove the temp files among `names`: only a writer that died leaves one (the caller holds the lock)."""
        for name in names:
            if name.startswith(TMP_PREFIX):
                kept = self.unlink_or_error(name)
                if kept is not None:  # a directory, an immutable file: it is in nobody's way, only said
                    log.warn("a temp name in the state directory cannot be removed", name=name[:120],
                             error=kept.strerror or str(kept))
