#!/usr/bin/env bash
# Set up, build the standalone binary, and run the demo (as root: it makes throwaway network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec .venv/bin/python scripts/demo.py
