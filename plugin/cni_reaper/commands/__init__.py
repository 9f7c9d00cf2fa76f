"""One module per CNI verb. Each exposes run(inv) -> result dict or None; imported only when its verb runs."""

from __future__ import annotations

from importlib import import_module

MODULES = {"ADD": "add", "DEL": "delete", "CHECK": "check", "STATUS": "status", "GC": "gc"}


def dispatch(inv):
    return import_module(f"{__name__}.{MODULES[inv.command]}").run(inv)
