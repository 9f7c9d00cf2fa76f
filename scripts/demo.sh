#!/usr/bin/env bash
# Set up, build the standalone binary, and run the demo (as root: it makes throwaway network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
PYTHONPATH="$PWD/tests" exec .venv/bin/python scripts/demo.py  # the helper package tests/testkit
