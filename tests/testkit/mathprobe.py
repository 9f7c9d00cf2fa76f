"""The release's math, computed by the shipped interpreter itself.

The glibc floor (scripts/elfver.py) changes which version of exp, log, log2 and pow the bundle's libpython
binds. To see what that does, a copy of an extracted release gets one file replaced: its
`cni_reaper/main.pyc` becomes `cni_reaper/main.py` with PROBE below, so that the shipped executable, the
shipped libpython and everything else of the bundle run it in place of the plugin. The probe computes
math.exp/log/log2/pow and float ** on the inputs it is given, and reads, in its own process, which
function libpython's GOT slot of each symbol holds, against what the C library answers for each version
(dlvsym).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

# Python 3.9 (the bundle's), standard library only, no f-string = specifiers beyond 3.6
PROBE = r'''
import ctypes, json, math, os, struct, sys


def _call(fn, args):
    try:
        return {"ok": float(fn(*args)).hex()}
    except Exception as exc:  # the exception is the result
        return {"error": type(exc).__name__}


FUNCS = {"exp": lambda x: math.exp(x), "log": lambda x: math.log(x), "log2": lambda x: math.log2(x),
         "pow": lambda x, y: math.pow(x, y), "**": lambda x, y: x ** y, "logb": lambda x, b: math.log(x, b)}


def _libpython():
    for line in open("/proc/self/maps"):
        parts = line.split()
        if len(parts) >= 6 and os.path.basename(parts[5]).startswith("libpython3") and int(parts[2], 16) == 0:
            # under PRoot the map names the file by its path outside the root: read the bundle's own copy
            path = os.path.join(os.path.dirname(sys.executable), "cni-reaper.lib", os.path.basename(parts[5]))
            return path, int(parts[0].split("-")[0], 16)
    raise SystemExit("libpython is not mapped")


def _slots(path):
    """symbol name -> r_offset of its GLOB_DAT / JUMP_SLOT relocation in libpython."""
    d = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", d, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", d, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for s in secs:
        if s[1] != 4:  # SHT_RELA
            continue
        sym = secs[s[6]]
        strtab = secs[sym[6]]
        for at in range(s[4], s[4] + s[5], 24):
            r_offset, r_info, _ = struct.unpack_from("<QQq", d, at)
            name_off, = struct.unpack_from("<I", d, sym[4] + (r_info >> 32) * 24)
            start = strtab[4] + name_off
            out.setdefault(d[start:d.index(b"\0", start)].decode(), r_offset)
    return out


def main():
    cases = json.loads(sys.stdin.read())
    results = [_call(FUNCS[c[0]], [float.fromhex(a) for a in c[1:]]) for c in cases]
    path, base = _libpython()
    slots = _slots(path)
    dl = ctypes.CDLL("libdl.so.2")
    dl.dlvsym.restype = ctypes.c_void_p
    dl.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    libm = ctypes.CDLL("libm.so.6")
    old = "GLIBC_2.2.5" if os.uname().machine == "x86_64" else "GLIBC_2.17"
    bound = {}
    for name in ("exp", "log", "log2", "pow"):
        got = ctypes.c_void_p.from_address(base + slots[name]).value
        versions = {v: dl.dlvsym(libm._handle, name.encode(), v.encode()) for v in (old, "GLIBC_2.29")}
        bound[name] = {"got": got, "versions": versions}
    print(json.dumps({"machine": os.uname().machine, "results": results, "bound": bound, "old": old}))
    return 0
'''

FIXED = [
    # exact or special values, and the cases where the answer is an exception (errno, as CPython reads it)
    ("exp", 0.0), ("exp", -0.0), ("exp", 1.0), ("exp", -1.0), ("exp", 709.78), ("exp", 709.79), ("exp", 1000.0),
    ("exp", -745.13), ("exp", -745.2), ("exp", -1000.0), ("exp", 1e-300), ("exp", math.inf), ("exp", -math.inf),
    ("exp", math.nan),
    ("log", 1.0), ("log", math.e), ("log", 0.0), ("log", -0.0), ("log", -1.0), ("log", 5e-324), ("log", 1.7976931348623157e308),
    ("log", math.inf), ("log", -math.inf), ("log", math.nan),
    ("log2", 1.0), ("log2", 1024.0), ("log2", 2.0 ** -1074), ("log2", 0.0), ("log2", -2.0), ("log2", 3.0), ("log2", math.inf),
    ("log2", math.nan),
    ("pow", 2.0, 10.0), ("pow", 2.0, 0.5), ("pow", 0.0, -1.0), ("pow", -0.0, -1.0), ("pow", -8.0, 1.0 / 3), ("pow", 10.0, 400.0),
    ("pow", 2.0, -1080.0), ("pow", 2.0, -1074.0), ("pow", -2.0, 3.0), ("pow", -2.0, 1e300), ("pow", math.inf, 0.0),
    ("pow", math.nan, 0.0), ("pow", 1.0, math.nan), ("pow", 0.0, 0.0), ("pow", -1.0, math.inf), ("pow", 0.5, -math.inf),
    ("**", 0.0, -1.0), ("**", 10.0, 400.0), ("**", 1.0000001, 1e10), ("**", 3.0, 0.5),
    ("logb", 8.0, 2.0), ("logb", 1000.0, 10.0), ("logb", 2.0, 1.0),
]


def cases(n: int = 300, seed: int = 23) -> list[tuple]:
    """The fixed cases and `n` reproducible draws over each function's useful range."""
    rng = random.Random(seed)
    out = list(FIXED)
    for _ in range(n):
        out.append(("exp", rng.uniform(-745, 709.7)))
        out.append(("log", math.ldexp(rng.random() + 0.5, rng.randint(-1074, 1023))))
        out.append(("log2", math.ldexp(rng.random() + 0.5, rng.randint(-1074, 1023))))
        out.append(("pow", rng.uniform(0, 50), rng.uniform(-180, 180)))
    return out


def encode(cs: list[tuple]) -> str:
    return json.dumps([[c[0], *(float(a).hex() for a in c[1:])] for c in cs])


FUNCS: dict[str, Callable[..., float]] = {"exp": math.exp, "log": math.log, "log2": math.log2, "pow": math.pow, "**": lambda x, y: x ** y,
         "logb": math.log}


def reference(case: tuple) -> dict:
    """What this test's own Python (the build machine's glibc, its exp/log/log2/pow at their current
    versions) answers: the known-good result."""
    try:
        return {"ok": float(FUNCS[case[0]](*case[1:])).hex()}
    except (ValueError, OverflowError, ZeroDivisionError) as exc:
        return {"error": type(exc).__name__}


def ulps(a: float, b: float) -> int:
    """Distance in units in the last place between two finite floats of the same sign (0 if equal)."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0
    if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b) or (a < 0) != (b < 0):
        return 1 << 62
    ia, ib = (struct.unpack("<q", struct.pack("<d", abs(x)))[0] for x in (a, b))
    return abs(ia - ib)


def mismatches(cs: list[tuple], got: list[dict], max_ulps: int = 1) -> list[str]:
    """Every case whose result is not the reference's: another exception, or more than max_ulps apart."""
    out = []
    for case, result in zip(cs, got):
        want = reference(case)
        if "error" in want or "error" in result:
            if want != result:
                out.append(f"{case}: {result} (expected {want})")
        elif ulps(float.fromhex(result["ok"]), float.fromhex(want["ok"])) > max_ulps:
            out.append(f"{case}: {float.fromhex(result['ok'])!r} (expected {float.fromhex(want['ok'])!r})")
    return out


def make_probe(bundle: Path, dest: Path) -> Path:
    """A copy of the bundle at `dest` whose plugin module is the probe; returns its executable."""
    shutil.copytree(bundle, dest, symlinks=True)
    pkg = dest / "cni-reaper.lib" / "cni_reaper"
    (pkg / "main.pyc").unlink()
    (pkg / "main.py").write_text(PROBE)
    # the bundle's code index (build/codeindex.py) holds the real main: without it every module is its file's
    (dest / "cni-reaper.lib" / "code.index").unlink()
    return dest / "cni-reaper"
