#!/usr/bin/env bash
# Install everything cni-reaper's build, demo and tests need on a Debian 12 machine, as root:
# the reference CNI plugins, iptables (both flavours), Go and go-cni (to build the test runtime driver),
# qemu-user-static and PRoot (the arm64 build and its tests), systemd's tools (systemd-analyze verify; systemd-nspawn
# boots the Debian 12 container the install is tested in), promtool (the Prometheus rules' tests),
# and a virtualenv at .venv with the package and its build/test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages; the tests create network namespaces)" >&2
  exit 1
fi

APT_PACKAGES=(iptables nftables conntrack iproute2 procps containernetworking-plugins golang-go
  golang-github-containerd-go-cni-dev python3 python3-venv python3-dev gcc debootstrap strace binutils systemd
  systemd-container)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# the arm64 release is built and tested under user-mode emulation, per process (qemu-user through PRoot):
# without recommends, since qemu-user-static's (binfmt-support) would register handlers with the kernel
NO_RECOMMENDS=(qemu-user-static proot)
quiet=()
for p in "${NO_RECOMMENDS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || quiet+=("$p")
done
if [ ${#missing[@]} -gt 0 ] || [ ${#quiet[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]} ${quiet[*]}"
  apt-get update -qq
  [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  [ ${#quiet[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${quiet[@]}" >/dev/null
fi

# promtool, for the tests of the shipped Prometheus rules (build/monitoring): only that program, taken out of
# Debian's prometheus package into /usr/local/bin. Installing the package would enable and start the
# Prometheus server (listening on :9090) and, by its recommends, node_exporter (:9100): nothing a test needs.
if ! command -v promtool >/dev/null; then
  echo "setup.sh: installing promtool (from Debian's prometheus package, without the server)"
  tmp=$(mktemp -d)
  (cd "$tmp" && { apt-get download -qq -o APT::Sandbox::User=root prometheus 2>/dev/null ||
    { apt-get update -qq && apt-get download -qq -o APT::Sandbox::User=root prometheus; }; })
  dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
  install -m 0755 "$tmp/usr/bin/promtool" /usr/local/bin/promtool
  rm -rf "$tmp"
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  rm -rf .venv  # none yet, or one left half made by an interrupted run
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check '.[build,test]' 2>&1 | grep -v -e '^WARNING: Location' -e 'Running pip as' || true
.venv/bin/python -c 'import cni_reaper, pydantic, pyroute2, PyInstaller'

echo "setup.sh: ready ($(.venv/bin/python --version), cni-reaper $(.venv/bin/python -c 'import cni_reaper; print(cni_reaper.__version__)'))"
