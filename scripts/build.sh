#!/usr/bin/env bash
# Build the standalone one-folder bundle dist/cni-reaper/ (executable dist/cni-reaper/cni-reaper).
# Uses the project venv made by scripts/setup.sh (or PYTHON=... to pick another interpreter with PyInstaller).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN \
  --distpath dist --workpath build/work build/cni-reaper.spec
echo "built dist/cni-reaper/cni-reaper"
