#!/usr/bin/env bash
# Benchmarks, as root, after the README's set-up (scripts/setup.sh): builds the bundle and the two floors the
# way releases are built (scripts/bundle.py), then measures in throwaway network namespaces (never the
# machine's own tables) and prints the table, the stage breakdown, the limits and the targets.
#   scripts/bench.sh [--pairs N] [--out bench/results.json] [--scales 10,100,1000] [--flavours nft,legacy]
#                    [--nomad-way-max N] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/setup.sh
scripts/build.sh >/dev/null
python3 scripts/bundle.py --floor >/dev/null
PYTHONPATH="$PWD/tests" exec .venv/bin/python scripts/bench.py "$@"  # the helper package tests/testkit
