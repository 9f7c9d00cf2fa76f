#!/usr/bin/env bash
# Build the standalone one-folder bundle dist/cni-reaper/ (executable dist/cni-reaper/cni-reaper, support folder
# dist/cni-reaper/cni-reaper.lib/), as root: on a Debian 11 root file system (glibc 2.31) made once with
# debootstrap and cached once per machine in /var/cache/cni-reaper/build, with a PyInstaller bootloader built
# from source that does not
# execute itself twice. The same bundle is tested, benchmarked and released (scripts/release.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/bundle.py "$@"
