#!/usr/bin/env bash
# Set up, lint and type-check, build the release (bundle, tarball, .deb), and run the whole test suite (as root: tests make
# network namespaces).
# Extra arguments go to pytest, e.g. scripts/test.sh -k runtime -x
set -euo pipefail
export CNI_REAPER_FULL_RUN=1  # a test whose tool is missing fails here (the set-up installs them all), never skips unseen
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "test.sh: ruff (lint) and mypy (types)"
.venv/bin/ruff check plugin tests scripts build
.venv/bin/mypy
# the Debian 11 roots the release tests run in (arm64's second stage runs under emulation for minutes), and the
# Debian 12 root with systemd that test_systemd.py boots, are made beside the rest; their own lock keeps pytest
# from making them twice, and a failure here is the tests' to report
(cd tests && ../.venv/bin/python -c 'from testkit import booted, debian11; debian11.root("amd64"); debian11.root("arm64"); booted.root()') \
  > /tmp/cni-reaper-test-roots.log 2>&1 &
roots=$!
# A whole run (no arguments) keeps both cores busy from the first minute:
# - the amd64 bundle (what the suite runs) is built first, in half a minute; the rest of the release (arm64's
#   bundle, minutes under emulation, then both architectures' tarballs and .debs) is built beside the suite;
# - the integration tests start at once, those marked `release` (they need the whole release and the Debian
#   test roots) last, once the release is there;
# - beside them, at a lower priority (they take the time the rest leaves idle), the unit tests, then the
#   stateful property test (test_property.py, thousands of plugin calls per flavour). Their output is printed
#   at the end, and any of them failing fails the run.
if [ $# -gt 0 ]; then
  scripts/release.sh
  wait "$roots" || echo "test.sh: making the Debian 11 test roots failed (see /tmp/cni-reaper-test-roots.log); the tests will say why"
  exec .venv/bin/python -m pytest -ra --durations=30 "$@"
fi
# none of an earlier run's marks is taken for this one's
rm -f /tmp/cni-reaper-property.rc /tmp/cni-reaper-unit.rc /tmp/cni-reaper-release.rc
scripts/build.sh --arch amd64 2>&1 | sed -u "s/^/[amd64] /"
(
  rrc=0
  CNI_REAPER_PREBUILT=amd64 scripts/release.sh > /tmp/cni-reaper-release.log 2>&1 || rrc=$?
  echo "$rrc" > /tmp/cni-reaper-release.rc
) &
release=$!
(
  urc=0
  nice -n 5 .venv/bin/python -m pytest -ra --durations=10 -p no:cacheprovider --basetemp=/tmp/cni-reaper-unit-tmp \
    tests/unit > /tmp/cni-reaper-unit.log 2>&1 || urc=$?
  echo "$urc" > /tmp/cni-reaper-unit.rc
  prc=0
  nice -n 10 .venv/bin/python -m pytest -ra -s -p no:cacheprovider --basetemp=/tmp/cni-reaper-property-tmp \
    tests/integration/test_property.py > /tmp/cni-reaper-property.log 2>&1 || prc=$?
  echo "$prc" > /tmp/cni-reaper-property.rc
) &
beside=$!
# a failed run: nothing is left running beside
trap 'pkill -P "$beside" 2>/dev/null || true; pkill -P "$release" 2>/dev/null || true; kill "$beside" "$release" 2>/dev/null || true' EXIT
rc=0
.venv/bin/python -m pytest -ra --durations=30 -m "not release" --ignore=tests/integration/test_property.py \
  tests/integration || rc=$?
wait "$release" || true
echo "test.sh: the rest of the release (arm64's bundle, the tarballs and .debs, built beside the tests):"
tail -n 15 /tmp/cni-reaper-release.log
rrc=$(cat /tmp/cni-reaper-release.rc 2>/dev/null || echo 1)
[ "$rrc" -eq 0 ] || echo "test.sh: the release build failed (exit $rrc; the whole output: /tmp/cni-reaper-release.log)"
wait "$roots" || echo "test.sh: making the Debian 11 test roots failed (see /tmp/cni-reaper-test-roots.log); the tests will say why"
.venv/bin/python -m pytest -ra --durations=10 -m release tests/integration || rc=$?
wait "$beside" || true
trap - EXIT
prc=$(cat /tmp/cni-reaper-property.rc 2>/dev/null || echo 1)
urc=$(cat /tmp/cni-reaper-unit.rc 2>/dev/null || echo 1)
echo "test.sh: the unit tests (tests/unit, run beside the integration tests):"
tail -n 25 /tmp/cni-reaper-unit.log
[ "$urc" -eq 0 ] || echo "test.sh: the unit tests failed (exit $urc; the whole output: /tmp/cni-reaper-unit.log)"
echo "test.sh: the property test (tests/integration/test_property.py, run beside the rest):"
tail -n 40 /tmp/cni-reaper-property.log
[ "$prc" -eq 0 ] || echo "test.sh: the property test failed (exit $prc; the whole output: /tmp/cni-reaper-property.log)"
[ "$rc" -eq 0 ] && [ "$rrc" -eq 0 ] && [ "$prc" -eq 0 ] && [ "$urc" -eq 0 ]
