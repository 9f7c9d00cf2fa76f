"""Write the published JSON Schemas (docs/schemas/<name>.schema.json) from the pydantic models, the one declaration
of cni-reaper's documents (plugin/cni_reaper/models.py, SCHEMAS, and tools/output.py, OUTPUTS): the record, the journal's item and each
command's --json output. tests/unit/test_published_schemas.py fails when a model changed and this was not run.

    .venv/bin/python scripts/schemas.py          # write them
    .venv/bin/python scripts/schemas.py --check  # exit 1 when one is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "schemas"


def rendered() -> dict[str, str]:
    from cni_reaper.tools.output import json_schema, published

    return {f"{name}.schema.json": json.dumps(json_schema(name), indent=1, sort_keys=True) + "\n" for name in published()}


def main(argv: list[str]) -> int:
    want = rendered()
    if "--check" in argv:
        have = {p.name: p.read_text() for p in OUT.glob("*.schema.json")}
        stale = sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))
        if stale:
            print(f"stale: {', '.join(stale)} (run scripts/schemas.py)", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for p in OUT.glob("*.schema.json"):
        if p.name not in want:
            p.unlink()
    for name, text in want.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(want)} schemas in {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
