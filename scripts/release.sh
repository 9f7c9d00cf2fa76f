#!/usr/bin/env bash
# Build a release, as root, on Debian 12 (offline apart from the package registries), from a clone, for
# each architecture ARCH in amd64 and arm64:
#   dist/cni-reaper-<version>-linux-ARCH.tgz    the executable cni-reaper and its support folder
#                                               cni-reaper.lib beside it, and wrap/portmap (a link to
#                                               it, for wrap mode), and monitoring/ (the Prometheus
#                                               rules, their promtool tests, the Grafana dashboard):
#                                               extract it into /opt/cni/bin
#   dist/cni-reaper-<version>-linux-ARCH.tgz.sha256
#   dist/cni-reaper_<version>_ARCH.deb          the bundle in /usr/lib/cni-reaper, /opt/cni/bin/cni-reaper
#                                               linking to it, conflists, Nomad examples and
#                                               monitoring/ in /usr/share/cni-reaper, the sweep's timer and service in
#                                               /lib/systemd/system (not enabled), the wrapper
#                                               directory /usr/lib/cni-reaper/wrap; removing it removes
#                                               exactly that
# The bundles are scripts/build.sh's (Debian 11 base of each architecture, glibc 2.28 floor); the two
# architectures build side by side (arm64's under user-mode emulation, see scripts/bundle.py). File times,
# owners and order are fixed to the last commit's time, so that a commit builds the same tarballs and
# packages. CNI_REAPER_ARCHES="amd64" builds one architecture only (for development). CNI_REAPER_PREBUILT="amd64"
# packages that architecture's bundle as scripts/build.sh left it in dist/, without building it again
# (scripts/test.sh: the suite starts on it while arm64's builds).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "release.sh: run as root (debootstrap, chroot)" >&2; exit 1; }
arches=${CNI_REAPER_ARCHES:-amd64 arm64}

# the tools the builds need on the machine, installed once before they start side by side (apt's lock);
# no recommends: qemu-user-static's would register binfmt handlers with the kernel
tools=()
command -v debootstrap >/dev/null || tools+=(debootstrap)
case " $arches " in *" arm64 "*)
  command -v proot >/dev/null || tools+=(proot)
  command -v qemu-aarch64-static >/dev/null || tools+=(qemu-user-static) ;;
esac
[ ${#tools[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${tools[@]}" >/dev/null

pids=() failed=0
for arch in $arches; do
  case " ${CNI_REAPER_PREBUILT:-} " in *" $arch "*) continue ;; esac
  ( set -o pipefail; scripts/build.sh --arch "$arch" 2>&1 | sed -u "s/^/[$arch] /" ) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "release.sh: a build failed (see above)" >&2; exit 1; }

# the tarballs and packages (scripts/package.sh)
for arch in $arches; do
  if [ "$arch" = amd64 ]; then scripts/package.sh amd64 dist/cni-reaper dist; else scripts/package.sh "$arch" "dist/$arch/cni-reaper" dist; fi
done
