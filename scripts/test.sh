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
# Debian 12 root with systemd that test_systemd.py boots, are
# made beside the release build, which leaves a core idle most of the time; their own lock keeps pytest
# from making them twice, and a failure here is the tests' to report
(cd tests && ../.venv/bin/python -c 'from testkit import booted, debian11; debian11.root("amd64"); debian11.root("arm64"); booted.root()') \
  > /tmp/cni-reaper-test-roots.log 2>&1 &
roots=$!
# A whole run (no arguments): the stateful property test (test_property.py, thousands of steps per flavour,
# minutes of plugin calls) runs beside the release build and the rest of the suite, in its own pytest, at a
# lower priority (it takes the time they leave idle, and does not slow them); once it is done, the unit tests
# run there too, beside the integration tests (the second core is otherwise idle for their last twenty
# minutes). Their output is printed at the end, and any of them failing fails the run.
beside=""
if [ $# -eq 0 ]; then
  # none of an earlier run's marks is taken for this one's
  rm -f /tmp/cni-reaper-property.rc /tmp/cni-reaper-unit.rc /tmp/cni-reaper-release.done
  (
    prc=0
    nice -n 10 .venv/bin/python -m pytest -ra -s -p no:cacheprovider --basetemp=/tmp/cni-reaper-property-tmp \
      tests/integration/test_property.py > /tmp/cni-reaper-property.log 2>&1 || prc=$?
    echo "$prc" > /tmp/cni-reaper-property.rc
    until [ -e /tmp/cni-reaper-release.done ]; do sleep 5; done  # the unit tests run the release's binary too
    urc=0
    nice -n 5 .venv/bin/python -m pytest -ra --durations=10 -p no:cacheprovider --basetemp=/tmp/cni-reaper-unit-tmp \
      tests/unit > /tmp/cni-reaper-unit.log 2>&1 || urc=$?
    echo "$urc" > /tmp/cni-reaper-unit.rc
  ) &
  beside=$!
  # a failed build: nothing is left running beside
  trap 'pkill -P "$beside" 2>/dev/null || true; kill "$beside" 2>/dev/null || true' EXIT
  set -- --ignore=tests/integration/test_property.py tests/integration
fi
scripts/release.sh  # both architectures' bundles (Debian 11 bases), tarballs and .debs: the suite runs against them
touch /tmp/cni-reaper-release.done
wait "$roots" || echo "test.sh: making the Debian 11 test roots failed (see /tmp/cni-reaper-test-roots.log); the tests will say why"
[ -n "$beside" ] || exec .venv/bin/python -m pytest -ra --durations=30 "$@"
rc=0
.venv/bin/python -m pytest -ra --durations=30 "$@" || rc=$?
wait "$beside" || true
trap - EXIT
prc=$(cat /tmp/cni-reaper-property.rc 2>/dev/null || echo 1)
urc=$(cat /tmp/cni-reaper-unit.rc 2>/dev/null || echo 1)
echo "test.sh: the property test (tests/integration/test_property.py, run beside the rest):"
tail -n 40 /tmp/cni-reaper-property.log
[ "$prc" -eq 0 ] || echo "test.sh: the property test failed (exit $prc; the whole output: /tmp/cni-reaper-property.log)"
echo "test.sh: the unit tests (tests/unit, run beside the integration tests once the property test was done):"
tail -n 25 /tmp/cni-reaper-unit.log
[ "$urc" -eq 0 ] || echo "test.sh: the unit tests failed (exit $urc; the whole output: /tmp/cni-reaper-unit.log)"
[ "$rc" -eq 0 ] && [ "$prc" -eq 0 ] && [ "$urc" -eq 0 ]
