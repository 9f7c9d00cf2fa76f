"""`print_json`: a command's `--json` document, checked against its published model (tools/output.py) before it
is printed, by the model's core schema generated from it (tools/output_checks.py): the call that prints one
loads pydantic-core alone, and no command loads it for its import (`list` and the timer's `sweep` without
`--json` load neither pydantic nor pydantic-core; `undo` reads the journal's items with their models)."""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_VALIDATORS: dict[str, Any] = {}


def print_json(name: str, document: Any) -> None:
    print(json.dumps(checked(name, document), indent=1, allow_nan=False))  # NaN, Infinity: not JSON (ValueError)


def checked(name: str, document: Any) -> Any:
    """`document`, checked against its published schema (tools/output_checks.SCHEMAS[name]); a CniError that
    says where it departs from it."""
    from pydantic_core import SchemaValidator, ValidationError

    if name not in _VALIDATORS:
        from cni_reaper.tools.output_checks import SCHEMAS

        _VALIDATORS[name] = SchemaValidator(SCHEMAS[name])
    try:
        _VALIDATORS[name].validate_python(document)
    except ValidationError as exc:
        from cni_reaper.errors import INTERNAL, CniError

        first = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".")
        raise CniError(INTERNAL, f"the `{name} --json` document does not follow its published schema "
                       f"(docs/schemas/{name}.schema.json)", f"{where or 'the document'}: {first['msg']}; the state "
                       "or journal holds what no cni-reaper writes: the command without --json shows it") from None
    return document
