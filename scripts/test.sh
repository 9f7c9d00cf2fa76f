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
# the Debian 11 roots the release tests run in (arm64's second stage runs under emulation for minutes) are
# made beside the release build, which leaves a core idle most of the time; their own lock keeps pytest
# from making them twice, and a failure here is the tests' to report
(cd tests && ../.venv/bin/python -c 'from testkit import debian11; debian11.root("amd64"); debian11.root("arm64")') \
  > /tmp/cni-reaper-test-roots.log 2>&1 &
roots=$!
scripts/release.sh  # both architectures' bundles (Debian 11 bases), tarballs and .debs: the suite runs against them
wait "$roots" || echo "test.sh: making the Debian 11 test roots failed (see /tmp/cni-reaper-test-roots.log); the tests will say why"
exec .venv/bin/python -m pytest -ra --durations=30 "$@"
