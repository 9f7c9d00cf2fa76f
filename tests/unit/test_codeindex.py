"""The bundle's code index (build/codeindex.py): modules served from one file are the modules the .pyc files
would give, and whatever the index cannot give is imported from the .pyc files as before."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parents[2] / "build"
sys.path.insert(0, str(BUILD))
import codeindex

# a support folder laid out as PyInstaller's noarchive one: .pyc files only, a package, a subpackage, a
# module of the standard library's (by name), a third-party one and a codec package left out
SOURCES = {
    "cni_reaper/__init__.py": "WHERE = 'pkg'\n",
    "cni_reaper/a.py": "from cni_reaper import b\nVALUE = b.VALUE + 1\n",
    "cni_reaper/b.py": "VALUE = 41\n",
    "cni_reaper/sub/__init__.py": "",
    "cni_reaper/sub/c.py": "import cni_reaper.a\nVALUE = cni_reaper.a.VALUE * 2\n",
    "json_like.py": "VALUE = 'std'\n",
    "thirdparty/__init__.py": "VALUE = 'third'\n",
    "encodings/__init__.py": "",
}
STDLIB = frozenset({"json_like", "encodings"})

# run in a fresh interpreter: install the index of LIB, import NAMES, print how each was loaded
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import codeindex
sys.path.insert(0, sys.argv[2])
installed = codeindex.install(sys.argv[2])
out = {"installed": installed}
for name in sys.argv[3:]:
    m = __import__(name, fromlist=["x"])
    out[name] = {"loader": type(m.__loader__).__name__, "file": m.__file__, "value": getattr(m, "VALUE", None)}
print(json.dumps(out))
"""


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    lib = tmp_path / "cni-reaper.lib"
    for rel, text in SOURCES.items():
        src = tmp_path / "src" / rel
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(text)
        out = lib / (rel[:-3] + ".pyc")
        out.parent.mkdir(parents=True, exist_ok=True)
        py_compile.compile(str(src), cfile=str(out), doraise=True)
    return lib


def _probe(lib: Path, *names: str) -> dict:
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, str(BUILD), str(lib), *names],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_index_holds_own_and_standard_modules_but_not_third_party_ones_or_codecs(lib: Path) -> None:
    written = codeindex.write(str(lib), STDLIB)
    table = codeindex.read_table(str(lib / codeindex.CODE_INDEX))
    assert table is not None and written == len(table)
    assert sorted(table) == ["cni_reaper", "cni_reaper.a", "cni_reaper.b", "cni_reaper.sub", "cni_reaper.sub.c",
                             "json_like"]
    assert table["cni_reaper.sub"][2] is True and table["cni_reaper.a"][2] is False


def test_modules_are_served_from_the_index_with_their_own_names_and_files(lib: Path) -> None:
    codeindex.write(str(lib), STDLIB)
    out = _probe(lib, "cni_reaper.sub.c", "json_like", "thirdparty")
    assert out["installed"] is True
    assert out["cni_reaper.sub.c"] == {"loader": "CodeFinder", "file": str(lib / "cni_reaper/sub/c.pyc"), "value": 84}
    assert out["json_like"]["loader"] == "CodeFinder" and out["json_like"]["value"] == "std"
    # not in the index: from its .pyc, as without one
    assert out["thirdparty"] == {"loader": "SourcelessFileLoader", "file": str(lib / "thirdparty/__init__.pyc"),
                                 "value": "third"}


def test_a_module_added_beside_the_index_is_imported_from_its_file(lib: Path) -> None:
    codeindex.write(str(lib), STDLIB)
    src = lib.parent / "src" / "late.py"
    src.write_text("VALUE = 'late'\n")
    py_compile.compile(str(src), cfile=str(lib / "cni_reaper" / "late.pyc"), doraise=True)
    out = _probe(lib, "cni_reaper.late")
    assert out["cni_reaper.late"]["loader"] == "SourcelessFileLoader" and out["cni_reaper.late"]["value"] == "late"


@pytest.mark.parametrize("damage", ["missing", "empty", "other magic", "another python", "torn table"])
def test_an_index_that_cannot_be_read_changes_nothing(lib: Path, damage: str) -> None:
    codeindex.write(str(lib), STDLIB)
    path = lib / codeindex.CODE_INDEX
    data = path.read_bytes()
    head = len(codeindex.MAGIC)
    damaged = {"missing": None, "empty": b"", "other magic": b"X" + data[1:],
               "another python": data[:head + 4] + b"\0\0\r\n" + data[head + 8:],
               "torn table": data[:head + 8 + 5]}[damage]
    if damaged is None:
        path.unlink()
    else:
        path.write_bytes(damaged)
    out = _probe(lib, "cni_reaper.sub.c")
    assert out["installed"] is False
    assert out["cni_reaper.sub.c"]["loader"] == "SourcelessFileLoader" and out["cni_reaper.sub.c"]["value"] == 84


def _damage_body(lib: Path, name: str) -> None:
    """An index of `lib` whose body of module `name` is no marshal data."""
    codeindex.write(str(lib), STDLIB)
    path = lib / codeindex.CODE_INDEX
    table = codeindex.read_table(str(path))
    assert table is not None
    offset, size, _ = table[name]
    data = bytearray(path.read_bytes())
    data[offset:offset + size] = b"\xff" * size
    path.write_bytes(bytes(data))


def test_a_damaged_module_in_the_index_is_imported_from_its_file(lib: Path) -> None:
    _damage_body(lib, "cni_reaper.b")
    out = _probe(lib, "cni_reaper.a")
    assert out["cni_reaper.a"]["value"] == 42 and out["cni_reaper.a"]["loader"] == "CodeFinder"


def test_pyc_files_of_two_pythons_make_no_index(lib: Path) -> None:
    pyc = lib / "cni_reaper" / "b.pyc"
    pyc.write_bytes(b"\0\0\r\n" + pyc.read_bytes()[4:])
    with pytest.raises(ValueError, match="another Python"):
        codeindex.write(str(lib), STDLIB)
    assert not (lib / codeindex.CODE_INDEX).exists()


def test_the_index_is_the_same_for_the_same_files(lib: Path) -> None:
    codeindex.write(str(lib), STDLIB)
    first = (lib / codeindex.CODE_INDEX).read_bytes()
    os.utime(lib / "cni_reaper" / "a.pyc", (0, 0))
    codeindex.write(str(lib), STDLIB)
    assert (lib / codeindex.CODE_INDEX).read_bytes() == first


def test_a_fifo_in_place_of_the_index_is_refused_at_once(lib: Path) -> None:
    os.mkfifo(lib / codeindex.CODE_INDEX)
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, str(BUILD), str(lib), "cni_reaper.a"],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["installed"] is False


def test_a_body_that_is_not_its_modules_is_imported_from_the_file(lib: Path) -> None:
    """An index copied over in place while a process reads it: the offsets it read point at other bytes."""
    codeindex.write(str(lib), STDLIB)
    path = lib / codeindex.CODE_INDEX
    table = codeindex.read_table(str(path))
    assert table is not None
    data = bytearray(path.read_bytes())
    a_at, a_size, _ = table["cni_reaper.a"]
    b_at, b_size, _ = table["cni_reaper.b"]
    body_b = bytes(data[b_at:b_at + b_size])
    # b's code where a's should be (the same length, a's name kept): still refused by its name
    data[a_at:a_at + a_size] = (body_b + b"\0" * a_size)[:a_size]
    path.write_bytes(bytes(data))
    out = _probe(lib, "cni_reaper.a")
    assert out["cni_reaper.a"]["value"] == 42


@pytest.mark.parametrize("entry", ["(1, 2)", "('x', 2, False)", "(0, 10 ** 9, False)", "(-5, 10, False)", "None",
                                   "(16, 10, 'yes')"])
def test_a_malformed_entry_sends_its_module_to_the_path_finder(lib: Path, entry: str) -> None:
    import marshal

    codeindex.write(str(lib), STDLIB)
    path = lib / codeindex.CODE_INDEX
    data = path.read_bytes()
    table = codeindex.read_table(str(path))
    assert table is not None
    table["cni_reaper.b"] = eval(entry)
    raw = marshal.dumps(table, 4)
    head = len(codeindex.MAGIC)
    n = int.from_bytes(data[head:head + 4], "little")
    assert len(raw) <= n
    path.write_bytes(data[:head + 8] + raw + b"\0" * (n - len(raw)) + data[head + 8 + n:])
    out = _probe(lib, "cni_reaper.a")
    assert out["installed"] is True and out["cni_reaper.a"]["value"] == 42


def test_a_table_length_past_the_file_is_refused(lib: Path) -> None:
    codeindex.write(str(lib), STDLIB)
    path = lib / codeindex.CODE_INDEX
    data = bytearray(path.read_bytes())
    head = len(codeindex.MAGIC)
    data[head:head + 4] = (0xFFFFFFF0).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    out = _probe(lib, "cni_reaper.a")
    assert out["installed"] is False and out["cni_reaper.a"]["value"] == 42


def test_a_module_neither_the_index_nor_its_file_can_give_is_an_import_error(lib: Path) -> None:
    """As without an index: code that imports an optional module (`except ImportError`) goes on."""
    _damage_body(lib, "cni_reaper.b")
    (lib / "cni_reaper" / "b.pyc").unlink()
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import codeindex; sys.path.insert(0, sys.argv[2]); "
             "codeindex.install(sys.argv[2])\ntry:\n    import cni_reaper.b\nexcept ImportError as e:\n"
             "    print('ImportError', e.name)")
    proc = subprocess.run([sys.executable, "-S", "-c", probe, str(BUILD), str(lib)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ImportError cni_reaper.b"
