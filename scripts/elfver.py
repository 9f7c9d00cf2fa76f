"""The GLIBC_ versions an ELF file needs, and the one change the release makes to get under a glibc floor.

An ELF file needs a glibc version in two places: each undefined dynamic symbol refers, through .gnu.version,
to an entry of .gnu.version_r (e.g. `exp` -> libm.so.6 GLIBC_2.29), and the dynamic linker refuses to load
the file if any .gnu.version_r entry is missing from the library it names, whether a symbol still uses it
or not. So both are read here, and both are changed:

- `lower()` makes the named symbols' references unversioned (their .gnu.version entry becomes 1,
  VER_NDX_GLOBAL: exactly what `patchelf --clear-symbol-version` writes). For an unversioned reference the
  dynamic linker takes the library's oldest version of the symbol (exp@GLIBC_2.2.5 on x86_64,
  exp@GLIBC_2.17 on aarch64), the one binaries linked before glibc 2.29 use.
- It then unlinks the .gnu.version_r entries no symbol refers to any more (patchelf leaves them: with
  GLIBC_2.29 still listed for libm.so.6 the file would not load on glibc 2.28); where that entry is the
  only one for its library, it names the base version instead (GLIBC_2.2.5 / GLIBC_2.17).

Both edits are in place (no byte moves, so the rest of the file is untouched) and the same every time.
ELF64 little-endian only (x86_64, aarch64); works on files of any architecture, on the build machine.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

SHT_DYNSYM, SHT_VERNEED, SHT_VERSYM = 11, 0x6FFFFFFE, 0x6FFFFFFF
SHN_UNDEF = 0
BASE_VERSION = {62: "GLIBC_2.2.5", 183: "GLIBC_2.17"}  # e_machine x86_64, aarch64: glibc's first version there


class Elf:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = bytearray(path.read_bytes())
        d = self.data
        if d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", d, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", d, 0x3A)
        self.sections = []
        for i in range(shnum):
            (_name, kind, _flags, _addr, offset, size, link, info, _align, entsize) = struct.unpack_from(
                "<IIQQQQIIQQ", d, shoff + i * shentsize)
            self.sections.append({"type": kind, "offset": offset, "size": size, "link": link, "info": info,
                                  "entsize": entsize})

    def _one(self, kind: int) -> dict | None:
        found = [s for s in self.sections if s["type"] == kind]
        return found[0] if found else None

    def _str(self, strtab: dict, offset: int) -> str:
        start = strtab["offset"] + offset
        return self.data[start:self.data.index(0, start)].decode()

    def verneed(self) -> list[dict]:
        """The entries of .gnu.version_r: file, version name, index, and where they sit (for unlinking)."""
        sec = self._one(SHT_VERNEED)
        if sec is None:
            return []
        strtab = self.sections[sec["link"]]
        out, at = [], sec["offset"]
        for _ in range(sec["info"]):
            _ver, cnt, file_off, aux, nxt = struct.unpack_from("<HHIII", self.data, at)
            a, prev = at + aux, None
            for _ in range(cnt):
                _hash, _flags, other, name_off, anext = struct.unpack_from("<IHHII", self.data, a)
                out.append({"file": self._str(strtab, file_off), "version": self._str(strtab, name_off),
                            "index": other, "need_at": at, "aux_at": a, "prev_aux_at": prev})
                prev = a
                if not anext:
                    break
                a += anext
            if not nxt:
                break
            at += nxt
        return out

    def undefined(self) -> list[dict]:
        """Undefined dynamic symbols with the version index each refers to and where that index is stored."""
        dynsym, versym = self._one(SHT_DYNSYM), self._one(SHT_VERSYM)
        if dynsym is None:
            return []
        strtab = self.sections[dynsym["link"]]
        out = []
        for i in range(dynsym["size"] // 24):
            name_off, _info, _other, shndx = struct.unpack_from("<IBBH", self.data, dynsym["offset"] + i * 24)
            if shndx != SHN_UNDEF or not name_off:
                continue
            at = versym["offset"] + 2 * i if versym else None
            index = struct.unpack_from("<H", self.data, at)[0] & 0x7FFF if at is not None else 1
            out.append({"name": self._str(strtab, name_off), "index": index, "versym_at": at})
        return out

    def write(self) -> None:
        self.path.write_bytes(bytes(self.data))


def elf_hash(name: str) -> int:
    """The System V ELF hash, which .gnu.version_r stores beside each version name."""
    h = 0
    for c in name.encode():
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def glibc(version: str) -> tuple[int, ...] | None:
    if not version.startswith("GLIBC_") or not version[6:7].isdigit():
        return None
    return tuple(int(x) for x in version[6:].split("."))


def needed(path: Path) -> dict[str, tuple[int, ...]]:
    """Each GLIBC_ version the file needs -> where from: 'symbol@VERSION' or 'file VERSION' (version_r)."""
    elf = Elf(path)
    need = elf.verneed()
    by_index = {n["index"]: n for n in need}
    out: dict[str, tuple[int, ...]] = {}
    for sym in elf.undefined():
        n = by_index.get(sym["index"])
        if n and (v := glibc(n["version"])):
            out[f"{sym['name']}@{n['version']}"] = v
    for n in need:
        if v := glibc(n["version"]):
            out[f"{n['file']} {n['version']}"] = v
    return out


def lower(path: Path, floor: tuple[int, ...], allowed: set[str]) -> list[str]:
    """Make the references to `allowed` symbols above `floor` unversioned and drop the version_r entries no
    symbol uses any more; returns what was changed. Anything else above the floor is left for the caller's
    check to refuse."""
    elf = Elf(path)
    need = elf.verneed()
    by_index = {n["index"]: n for n in need}
    changes = []
    for sym in elf.undefined():
        n = by_index.get(sym["index"])
        v = glibc(n["version"]) if n else None
        if v and v > floor and sym["name"] in allowed:
            struct.pack_into("<H", elf.data, sym["versym_at"], 1)
            changes.append(f"{sym['name']}@{n['version']} -> {sym['name']} (unversioned)")
    still = {s["index"] for s in elf.undefined()}
    while True:  # one entry at a time: each unlinking changes the chain that is read anew
        elfver_need = elf.verneed()
        unused = [n for n in elfver_need if (v := glibc(n["version"])) and v > floor and n["index"] not in still]
        if not unused:
            break
        n = unused[0]
        # unlink the aux entry from its file's chain: the entry before it (or the file's entry) steps over it
        _h, _f, _o, _name, anext = struct.unpack_from("<IHHII", elf.data, n["aux_at"])
        ver, cnt, file_off, aux, nxt = struct.unpack_from("<HHIII", elf.data, n["need_at"])
        if cnt < 2:
            # the file's only requirement of that library: it becomes the architecture's base version, which
            # every library of glibc defines (its name is taken from another requirement of the file)
            want = BASE_VERSION.get(struct.unpack_from("<H", elf.data, 18)[0])
            base = next((m for m in elfver_need if m["version"] == want), None)
            if base is None:
                raise SystemExit(f"elfver: {path}: no base version to give {n['file']} instead of {n['version']}")
            _bh, _bf, _bo, base_name, _bn = struct.unpack_from("<IHHII", elf.data, base["aux_at"])
            _h, flags, other, _name, anext = struct.unpack_from("<IHHII", elf.data, n["aux_at"])
            struct.pack_into("<IHHII", elf.data, n["aux_at"], elf_hash(base["version"]), flags, other, base_name, anext)
            changes.append(f"version need {n['file']} {n['version']} -> {base['version']} (no symbol uses it)")
            continue
        if n["prev_aux_at"] is None:
            aux = aux + anext
        else:
            p = n["prev_aux_at"]
            ph, pf, po, pname, pnext = struct.unpack_from("<IHHII", elf.data, p)
            struct.pack_into("<IHHII", elf.data, p, ph, pf, po, pname, pnext + anext if anext else 0)
        struct.pack_into("<HHIII", elf.data, n["need_at"], ver, cnt - 1, file_off, aux, nxt)
        changes.append(f"version need {n['file']} {n['version']} removed (no symbol uses it)")
    if changes:
        elf.write()
    return changes


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        for where, _v in sorted(needed(Path(arg)).items(), key=lambda kv: kv[1]):
            print(f"{arg}: {where}")
