"""The command line's JSON documents: each checked against its published schema (models.SCHEMAS,
docs/schemas/<name>.schema.json) before it is printed, so that what a command prints is what its schema says."""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def print_json(name: str, document: Any) -> None:
    from cni_reaper.models import output

    print(json.dumps(output(name, document), indent=1))
