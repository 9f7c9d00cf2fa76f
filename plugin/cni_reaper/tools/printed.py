"""`print_json`: a command's `--json` document, checked against its published model before it is printed
(tools/output.py). pydantic and the models are loaded by the call that prints one, never by the commands' import:
`list`, `sweep` (the timer's), `undo` without `--json` start no slower for them."""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def print_json(name: str, document: Any) -> None:
    from cni_reaper.tools.output import output

    print(json.dumps(output(name, document), indent=1))
