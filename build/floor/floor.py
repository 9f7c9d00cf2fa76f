"""The floor: a plugin that only passes prevResult through. Bundled exactly like cni-reaper, it measures what
any one-folder PyInstaller plugin costs before it does any work (scripts/bench.sh)."""

import json
import sys

conf = json.load(sys.stdin)
if conf.get("prevResult") is not None:
    sys.stdout.write(json.dumps(conf["prevResult"]))
