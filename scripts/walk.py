"""The walk of a DEL with nothing stale (CONTRIBUTING.md, "A DEL, step by step"): one allocation is added through
go-cni in a throwaway sandbox, then deleted with cni-reaper run under a profile hook that notes every call from
one package of cni_reaper into another (cni, verbs, state, reap, judge, tools, wrap; the top-level utility
modules, log, files, jsonio, values, errors, gojson, are counted apart). Prints the crossings in order and
their count. As root, after scripts/setup.sh:

    .venv/bin/python scripts/walk.py [--flavour nft|legacy]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

HOOK = r'''
import json, os, sys
crossings, utility = [], [0]
def package(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "cni_reaper" else ("" if parts[0] != "cni_reaper" else "-")
def hook(frame, event, arg):
    if event != "call":
        return
    callee = frame.f_globals.get("__name__", "")
    back = frame.f_back
    caller = back.f_globals.get("__name__", "") if back is not None else ""
    a, b = package(caller), package(callee)
    if not a or not b or a == b:
        return
    if b == "-" or a == "-":
        utility[0] += 1
        return
    crossings.append(f"{caller}.{back.f_code.co_name} -> {callee}.{frame.f_code.co_name}")
_exit = os._exit
def noted_exit(code):  # a CNI call ends with os._exit: the walk is written first
    sys.setprofile(None)
    with open(os.environ["WALK_OUT"], "w") as f:
        json.dump({"crossings": crossings, "utility": utility[0]}, f)
    _exit(code)
os._exit = noted_exit
sys.setprofile(hook)
from cni_reaper.main import main
main()
'''


def main() -> int:
    from testkit.sandbox import DEBIAN12, ips_of, open_sandbox, unique

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavour", default="nft", choices=("nft", "legacy"))
    args = p.parse_args()
    exe = str(Path(sys.executable).parent / "cni-reaper")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sb = open_sandbox(root / "sb", args.flavour, exe, DEBIAN12)
        out = sb.root / "walk.json"  # where the sandbox's processes write
        try:
            cid, netns = unique("alloc-"), sb.container()
            ips_of(sb.driver("add", cid, netns, ("8080:80/tcp",)))
            walker = sb.plugin_dir / "cni-reaper"
            walker.unlink()
            walker.write_text(f"#!{sys.executable}\n{HOOK}")
            walker.chmod(0o755)
            sb.extra_env["WALK_OUT"] = str(out)
            proc = sb.driver("del", cid, netns, ("8080:80/tcp",))
            assert proc.returncode == 0, proc.stderr
        finally:
            sb.close()
        walk = json.loads(out.read_text())
    for line in walk["crossings"]:
        print(line)
    pairs = sorted({(c.split(" -> ")[0].rsplit(".", 1)[0], c.split(" -> ")[1].rsplit(".", 1)[0]) for c in walk["crossings"]})
    print(f"{len(walk['crossings'])} calls cross between packages, {len(pairs)} distinct module pairs; "
          f"{walk['utility']} calls into the top-level utility modules")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
