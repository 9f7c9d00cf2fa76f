#!/usr/bin/env bash
# Set up, lint and type-check, build the release (bundle, tarball, .deb), and run the whole test suite (as root: tests make
# network namespaces).
# Extra arguments go to pytest, e.g. scripts/test.sh -k runtime -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "test.sh: ruff (lint) and mypy (types)"
.venv/bin/ruff check plugin tests scripts build
.venv/bin/mypy
scripts/release.sh  # the release bundle (Debian 11 base), its tarball and .deb: the suite runs against them
exec .venv/bin/python -m pytest -ra "$@"
