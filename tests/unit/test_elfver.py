"""scripts/elfver.py on programs compiled here against this machine's glibc (2.36): what it reads agrees with
readelf, what it lowers still runs and computes the same, and what it may not lower is left for the
build's check to refuse."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.tools import needs_tool

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import elfver

FLOOR = (2, 28)
MATH = {"exp", "log", "log2", "pow"}
# sin and cos keep GLIBC_2.2.5 beside GLIBC_2.29 in libm's requirements; the order of the two in
# .gnu.version_r follows first use, so both programs below put GLIBC_2.29 in another place of the chain
PROGRAMS = {
    "math-first": 'double x = atof(argv[1]); printf("%a %a %a %a %a\\n", exp(x), log(x), log2(x), pow(x, 1.5), sin(x));',
    "math-last": 'double x = atof(argv[1]); printf("%a %a %a %a %a\\n", sin(x), cos(x), exp(x), log(x), pow(x, x));',
}


def compile_program(tmp_path: Path, name: str, body: str, extra: str = "") -> Path:
    needs_tool("gcc", "scripts/setup.sh installs it")
    src = tmp_path / f"{name}.c"
    src.write_text("#define _GNU_SOURCE\n#include <math.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <spawn.h>\n"
                   f"{extra}\nint main(int argc, char **argv) {{ {body} return 0; }}\n")
    out = tmp_path / name
    subprocess.run(["gcc", "-O0", "-fno-builtin", "-o", str(out), str(src), "-lm"], check=True)
    return out


def readelf_glibc(path: Path) -> set[str]:
    text = "".join(subprocess.run(["readelf", "-W", flag, str(path)], capture_output=True, text=True, check=True).stdout
                   for flag in ("--dyn-syms", "--version-info"))
    return set(re.findall(r"GLIBC_\d+(?:\.\d+)+", text))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_lowering_the_math_symbols_leaves_no_glibc_2_29_and_the_same_results(tmp_path, name):
    exe = compile_program(tmp_path, name, PROGRAMS[name])
    assert "GLIBC_2.29" in readelf_glibc(exe)
    assert any(v == (2, 29) for v in elfver.needed(exe).values())
    before = [subprocess.run([str(exe), x], capture_output=True, text=True, check=True).stdout
              for x in ("0.5", "2", "700", "1e-300")]
    changes = elfver.lower(exe, FLOOR, MATH)
    assert any("version need libm.so.6 GLIBC_2.29 removed" in c for c in changes), changes
    assert "GLIBC_2.29" not in readelf_glibc(exe)  # neither a symbol nor a requirement
    assert max(elfver.needed(exe).values()) <= (2, 34)  # __libc_start_main@GLIBC_2.34 of this machine's crt
    assert [v for v in elfver.needed(exe).values() if v == (2, 29)] == []
    after = [subprocess.run([str(exe), x], capture_output=True, text=True, check=True).stdout
             for x in ("0.5", "2", "700", "1e-300")]
    assert after == before
    assert elfver.lower(exe, FLOOR, MATH) == []  # done once, nothing left to do


def test_symbols_it_may_not_lower_are_left_for_the_check(tmp_path):
    """posix_spawn_file_actions_addchdir_np is GLIBC_2.29 too, but not one of the math functions: it stays."""
    exe = compile_program(tmp_path, "spawn", 'posix_spawn_file_actions_t a; posix_spawn_file_actions_init(&a); '
                          'posix_spawn_file_actions_addchdir_np(&a, "/"); printf("%a\\n", exp(atof(argv[1])));')
    elfver.lower(exe, FLOOR, MATH)
    left = {where for where, v in elfver.needed(exe).items() if v > FLOOR}
    assert "posix_spawn_file_actions_addchdir_np@GLIBC_2.29" in left and "libc.so.6 GLIBC_2.29" in left
    assert not any(w.startswith("exp@") or w == "libm.so.6 GLIBC_2.29" for w in left), left
    assert subprocess.run([str(exe), "1"], capture_output=True, text=True, check=True).stdout == "0x1.5bf0a8b145769p+1\n"
