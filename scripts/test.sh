#!/usr/bin/env bash
# Set up, build the standalone binary, and run the whole test suite (as root: tests make network namespaces).
# Extra arguments go to pytest, e.g. scripts/test.sh -k runtime -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec .venv/bin/python -m pytest -ra "$@"
