#!/usr/bin/env bash
# Benchmarks, as root, after the README's set-up (scripts/setup.sh): builds the binary and the floor bundle,
# then measures in throwaway network namespaces (never the machine's own tables) and prints a table.
#   scripts/bench.sh [--pairs N] [--out bench/results.json] [--scales 10,100,1000] [--nomad-way-max N] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/setup.sh
scripts/build.sh >/dev/null
.venv/bin/python -m PyInstaller --noconfirm --log-level ERROR --distpath dist --workpath build/work build/floor.spec >/dev/null
PYTHONPATH="$PWD/tests" exec .venv/bin/python scripts/bench.py "$@"  # the helper package tests/testkit
