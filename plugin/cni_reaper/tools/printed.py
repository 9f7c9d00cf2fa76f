"""`print_json`: a command's `--json` document, checked against its published model (tools/output.py) before it
is printed, by the model's core schema generated from it (tools/output_checks.py): the call that prints one
loads pydantic-core alone, and no command loads it for its import (`list` and the timer's `sweep` without
`--json` load neither pydantic nor pydantic-core; `undo` reads the journal's items with their models)."""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def print_json(name: str, document: Any) -> None:
    from cni_reaper.tools.output_checks import checked

    print(json.dumps(checked(name, document), indent=1, allow_nan=False))  # NaN, Infinity: not JSON (ValueError)
