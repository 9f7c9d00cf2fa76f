"""One module per CNI verb. Each exposes run(inv) -> result dict or None; imported only when its verb runs."""

from __future__ import annotations

MODULES = {"ADD": "add", "DEL": "delete", "CHECK": "check", "STATUS": "status", "GC": "gc"}


def dispatch(inv):
    name = MODULES[inv.command]
    module = __import__(f"cni_reaper.verbs.{name}", fromlist=[name])
    return module.run(inv)
