"""The bundle's code index: the compiled modules a CNI call imports, in one file read with one pread each.

With PyInstaller's `noarchive` every module is a .pyc file in cni-reaper.lib, and the interpreter's path
finder pays for each one: a directory check, a stat, an open, a read, a header check (about 45 us here for
an empty module, more than unmarshalling and running most of ours). A nothing-stale ADD or DEL imports some
20 modules of cni-reaper and a dozen of the standard library after the entry point. `write` (scripts/bundle.py,
once the bundle is built) copies their code, unchanged, out of the .pyc files PyInstaller compiled into one
file, cni-reaper.lib/CODE_INDEX, with a table of where each module's code is; `install` (build/entry.py, the
bundle's first step) puts a finder in front of the path finder that serves those modules from it. The .pyc
files stay where they are: whatever the index does not hold, or cannot give (an index of another Python, a
damaged file), is imported from them as before. Modules keep their names, packages and `__file__`. What the
index holds wins over a file beside it: a .pyc replaced in place is read once code.index is removed.

Layout: MAGIC, a 4-byte little-endian length n, the 4 bytes of Python's magic number, then n bytes of marshal
(version 4) of {name: (offset, size, is_package)}, then each module's body: its name, a NUL, and its code
(the .pyc's body after its 16-byte header). The reader trusts none of it: an entry or a body it cannot take
(a file cut, copied over in place while a process reads it, a FIFO in its place) sends that import to the
path finder.
"""

# no `from __future__ import annotations`: the bundle would import one more module from its file first
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import CodeType, ModuleType

    Table = dict[str, tuple[int, int, bool]]  # module name -> (offset, size, is_package)

CODE_INDEX = "code.index"
MAGIC = b"cni-reaper code index 1\n"
HEADER = 16  # a .pyc's header: Python's magic number, flags, and two words of source stamp or hash

# what the index holds: cni-reaper's own modules, and the standard library's pure-Python ones beside them
# (not the third-party packages, whose loaders some of them look at; not the codecs, which the interpreter
# loads before the entry point and looks up by name later)
OWN = "cni_reaper"
LEFT_OUT = frozenset({"encodings"})


class CodeFinder:
    """A meta path finder for the modules in the index at `path` (`table`: name -> (offset, size, is_package);
    `identity`: the file's device, inode and size when its table was read). Whatever it cannot give, for
    whatever reason, the path finder gives. It holds no descriptor between imports."""

    def __init__(self, path: str, identity: "tuple[int, int, int]", table: "Table", lib: str,
                 spec: "type[ModuleSpec]") -> None:
        self.path, self.identity, self.table, self.lib, self.spec = path, identity, table, lib, spec

    def find_spec(self, name: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
                  ) -> "ModuleSpec | None":
        entry = self.table.get(name)
        if type(entry) is not tuple or len(entry) != 3 or (entry[2] is not True and entry[2] is not False):
            return None  # not in the index, or a damaged entry: the path finder's
        where = os.path.join(self.lib, *name.split("."))
        origin = os.path.join(where, "__init__.pyc") if entry[2] else where + ".pyc"
        spec = self.spec(name, self, origin=origin, is_package=entry[2])  # type: ignore[arg-type] # a Loader in all but name
        spec.has_location = True  # __file__, as the path finder would set it
        if entry[2]:
            spec.submodule_search_locations = [where]
        return spec

    def create_module(self, spec: "ModuleSpec") -> None:
        return None

    def exec_module(self, module: "ModuleType") -> None:
        code = self._code(module.__name__)
        if code is None:  # a damaged index, or one changed under this process: the module's own .pyc
            try:
                with open(module.__file__ or "", "rb") as f:
                    code = marshal.loads(f.read()[HEADER:])
            except (OSError, ValueError, EOFError) as exc:  # as the path finder says a module it cannot load
                raise ImportError(f"{module.__name__}: {exc}", name=module.__name__) from None
        exec(code, module.__dict__)

    def _code(self, name: str) -> "CodeType | None":
        """The module's code from the index; None when the index cannot give it: its entry, its body (each
        begins with its module's name), a file that is no longer the one whose table was read."""
        try:
            offset, size, _ = self.table[name]
            if type(offset) is not int or type(size) is not int or not 0 <= offset <= self.identity[2] - size:
                return None
            fd = _opened(self.path)
            try:
                if _identity(os.fstat(fd)) != self.identity:
                    return None
                data = os.pread(fd, size, offset)
            finally:
                os.close(fd)
            tag = name.encode() + b"\0"
            if not data.startswith(tag):
                return None
            code = marshal.loads(memoryview(data)[len(tag):])
        except Exception:  # noqa: BLE001 - OSError, ValueError, EOFError, TypeError, MemoryError: the .pyc's then
            return None
        return code if type(code) is _CODE else None


_CODE = type(CodeFinder.find_spec.__code__)


def install(lib: str) -> bool:
    """Serve the modules of `lib`/CODE_INDEX first; False (nothing changed) when it is missing, not a regular
    file, damaged, or made for another Python."""
    path = os.path.join(lib, CODE_INDEX)
    opened = _open(path)
    if opened is None:
        return False
    sys.meta_path.insert(0, CodeFinder(path, *opened, lib, sys.modules["_frozen_importlib"].ModuleSpec))
    return True


def read_table(path: str) -> "Table | None":
    """The table of the index at `path` (None: missing, damaged, or of another Python)."""
    opened = _open(path)
    return None if opened is None else opened[1]


def _opened(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO in its place answers at once


def _identity(st: "os.stat_result") -> "tuple[int, int, int]":
    return st.st_dev, st.st_ino, st.st_size


def _open(path: str) -> "tuple[tuple[int, int, int], Table] | None":
    """The index's identity and table, read once (None: it cannot be used)."""
    try:
        fd = _opened(path)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:  # S_ISREG, without importing stat
            raise ValueError("not a regular file")
        head = os.pread(fd, len(MAGIC) + 8, 0)
        python = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
        if head[:len(MAGIC)] != MAGIC or head[len(MAGIC) + 4:] != python:
            raise ValueError("not an index of this Python")
        n = int.from_bytes(head[len(MAGIC):len(MAGIC) + 4], "little")
        if n > st.st_size - len(head):
            raise ValueError("a table longer than the file")
        table = marshal.loads(os.pread(fd, n, len(head)))
        if type(table) is not dict:
            raise ValueError("no table")
    except Exception:  # noqa: BLE001 - whatever it is, the index is not used
        return None
    finally:
        os.close(fd)
    return _identity(st), table


def _modules(lib: str, stdlib: "frozenset[str]") -> "dict[str, tuple[str, bool]]":
    """name -> (.pyc path, is_package) of every module the index holds."""
    out = {}
    for root, dirs, files in os.walk(lib):
        dirs.sort()
        rel = os.path.relpath(root, lib)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and (parts[0] in LEFT_OUT or not (parts[0] == OWN or parts[0] in stdlib)):
            dirs[:] = []
            continue
        for f in sorted(files):
            if not f.endswith(".pyc"):
                continue
            stem = f[:-4]
            if not parts and stem not in stdlib and stem != OWN:
                continue
            if stem == "__init__":
                if parts:
                    out[".".join(parts)] = (os.path.join(root, f), True)
            else:
                out[".".join([*parts, stem])] = (os.path.join(root, f), False)
    return out


def write(lib: str, stdlib: "frozenset[str]") -> int:
    """Write `lib`/CODE_INDEX from the .pyc files PyInstaller compiled (all of one Python): cni-reaper's and
    those of the standard library's modules named in `stdlib`. Returns how many modules it holds."""
    modules = _modules(lib, stdlib)
    magic = None
    bodies = []
    for name, (path, package) in sorted(modules.items()):
        with open(path, "rb") as f:
            data = f.read()
        if magic is None:
            magic = data[:4]
        elif data[:4] != magic:
            raise ValueError(f"{path}: compiled by another Python")
        bodies.append((name, package, name.encode() + b"\0" + data[HEADER:]))
    if magic is None:
        raise ValueError(f"{lib}: no compiled modules")
    # the table's offsets depend on its own length: lay it out with room to spare, then fix it
    table: Table = {}
    size = len(marshal.dumps({n: (1 << 40, len(b), p) for n, p, b in bodies}, 4))
    start = len(MAGIC) + 4 + 4 + size
    offset = start
    for name, package, body in bodies:
        table[name] = (offset, len(body), package)
        offset += len(body)
    raw = marshal.dumps(table, 4)
    raw += b"\0" * (size - len(raw))  # marshal's ints of offsets below 1 << 40 take no more room
    path = os.path.join(lib, CODE_INDEX)
    with open(path + ".tmp", "wb") as f:
        f.write(MAGIC + size.to_bytes(4, "little") + magic + raw)
        for _, _, body in bodies:
            f.write(body)
    os.replace(path + ".tmp", path)
    return len(bodies)
