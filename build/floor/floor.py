"""The floor: a plugin that only passes prevResult through, reading and writing JSON the way cni-reaper's hot
path does (the `_json` accelerator, no `json` package). Bundled exactly like cni-reaper, it measures what any
one-folder PyInstaller plugin costs before it does any work (scripts/bench.sh)."""

import _json
import sys


class _Context:
    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int, parse_constant = float, int, None


conf, _ = _json.make_scanner(_Context())(sys.stdin.buffer.read().decode(), 0)
if conf.get("prevResult") is not None:
    encode = _json.make_encoder(None, str, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
    sys.stdout.write("".join(encode(conf["prevResult"], 0)))
