"""Go's encoding/json rules, for the documents cni-reaper reads.

The reference plugins decode their input into Go structs, and cni-reaper must accept whatever they accept
(docs/how-it-works.md, "Never block an allocation"). encoding/json, decoding an object into a struct:

- matches each key to a field by its exact name, else case-insensitively (Unicode simple folding: for the
  ASCII field names here that is ASCII case, plus U+017F LATIN SMALL LETTER LONG S for `s` and U+212A
  KELVIN SIGN for `k`); when several keys match one field, the last one in the document wins;
- ignores keys that match no field;
- on `null`, leaves a string, number or bool field as it was and sets a slice, map or pointer to nil.

`pick` applies exactly that to one object. A field it leaves out is at its zero value: the caller applies
its default, as a Go plugin does for an empty field.
"""

from __future__ import annotations

TYPE_CHECKING = False  # annotations only: importing typing costs milliseconds on every call
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

_NON_ASCII_FOLDS = {0x17F: "s", 0x212A: "k"}
_tables: dict[tuple[str, ...], dict[str, str]] = {}


def fold(key: str) -> str | None:
    """The key as it compares with an ASCII field name under Go's folding; None if it can match none."""
    if not key.isascii():
        key = key.translate(_NON_ASCII_FOLDS)
        if not key.isascii():
            return None
    return key.lower()


def _table(names: tuple[str, ...]) -> dict[str, str]:
    table = _tables.get(names)
    if table is None:
        table = _tables[names] = {name.lower(): name for name in names}
    return table


def pick(obj: dict, names: tuple[str, ...], resettable: Iterable[str] = ()) -> dict[str, Any]:
    """The values of `obj` for the struct fields `names`, keyed by field name.

    `resettable`: fields of slice, map or pointer type, which a later `null` resets; a `null` for any other
    field changes nothing. A field that is absent or was reset is left out of the answer.
    """
    table = _table(names)
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key in names:
            name = key
        else:
            folded = fold(key)
            name = table.get(folded) if folded is not None else None
            if name is None:
                continue
        if value is None:
            if name in resettable:
                out.pop(name, None)
            continue
        out[name] = value
    return out


def given(obj: dict, name: str) -> list[Any]:
    """Every value (not null) that `obj` gives field `name` under any key Go takes for it ("mode", "Mode",
    "MODE"): which one a Go program decodes depends on the keys' order, and libcni re-marshals a plugin's entry
    with its keys sorted, so a reader of the file and the plugin may each see another."""
    low = name.lower()
    return [val for key, val in obj.items() if val is not None and (key == name or fold(key) == low)]


def lookup(obj: dict, name: str) -> tuple[bool, Any]:
    """(found, value) of one field of `obj`, by the same rules; `null` counts as found with value None."""
    found, value = False, None
    low = name.lower()
    for key, val in obj.items():
        if key == name or fold(key) == low:
            found, value = True, val
    return found, value
