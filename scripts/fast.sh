#!/usr/bin/env bash
# The contributor's fast loop (CONTRIBUTING.md): the unit tests that need neither root nor a release build,
# with the property tests' example counts cut to a fifth (the full run, scripts/test.sh, runs them all),
# then ruff and mypy. Arguments go to pytest (e.g. -k index).
set -euo pipefail
cd "$(dirname "$0")/.."
export CNI_REAPER_SCHEMA_EXAMPLES="${CNI_REAPER_SCHEMA_EXAMPLES:-300}" CNI_REAPER_FUZZ_EXAMPLES="${CNI_REAPER_FUZZ_EXAMPLES:-200}"
export CNI_REAPER_HOSTILE_EXAMPLES="${CNI_REAPER_HOSTILE_EXAMPLES:-2000}" CNI_REAPER_GO_SHAPES_EXAMPLES="${CNI_REAPER_GO_SHAPES_EXAMPLES:-1000}"
.venv/bin/pytest -q -p no:cacheprovider -m "not slow and not netns" tests/unit "$@"
.venv/bin/ruff check plugin tests scripts build
.venv/bin/mypy
