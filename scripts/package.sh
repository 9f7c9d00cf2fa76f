#!/usr/bin/env bash
# Package one architecture's bundle (scripts/release.sh runs this for each): ARCH BUNDLE-DIR OUT-DIR
#   OUT-DIR/cni-reaper-<version>-linux-ARCH.tgz (+ .sha256)   the bundle, wrap/ and monitoring/
#   OUT-DIR/cni-reaper_<version>_ARCH.deb                      laid out as scripts/release.sh says
# File times are the last commit's (SOURCE_DATE_EPOCH if set), owners and order fixed: the same commit and
# bundle make the same files. Needs no root (dpkg-deb --root-owner-group); tests/unit/test_monitoring.py
# packages a stand-in bundle with it to check what the tarball and the .deb ship.
set -euo pipefail
[ $# = 3 ] || { echo "usage: scripts/package.sh ARCH BUNDLE-DIR OUT-DIR" >&2; exit 2; }
arch=$1 bundle=$(realpath "$2") out=$(realpath "$3")
cd "$(dirname "$0")/.."
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' plugin/cni_reaper/__init__.py)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
name="cni-reaper-$version-linux-$arch"
MONITORING=(build/monitoring/cni-reaper.rules.yml build/monitoring/tests.yml build/monitoring/cni-reaper-dashboard.json)
stamp() { find "$1" -exec touch -h -d "@$epoch" {} +; }

# what ships is staged in a copy: the bundle directory itself (what the suite runs meanwhile) is not changed
stage=$(mktemp -d) root=$(mktemp -d)
trap 'rm -rf "$stage" "$root"' EXIT
chmod 0755 "$stage" "$root"
cp -a "$bundle/cni-reaper" "$bundle/cni-reaper.lib" "$stage/"
# the wrapper directory (wrap mode, for Nomad's own bridge network): a link portmap to cni-reaper, inert until
# the operator puts the directory first in the client's cni_path
mkdir -m 0755 "$stage/wrap" && ln -s ../cni-reaper "$stage/wrap/portmap"
# the Prometheus rules (and their promtool tests) and the Grafana dashboard (docs/reference.md, "Alerts and a
# dashboard"): plain files in monitoring/, nothing Nomad's fingerprinting of cni_path runs
mkdir -m 0755 "$stage/monitoring"
install -m 0644 "${MONITORING[@]}" "$stage/monitoring/"
# the tarball
stamp "$stage"
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner -C "$stage" -cf - cni-reaper cni-reaper.lib wrap monitoring \
  | gzip -n -9 > "$out/$name.tgz"
(cd "$out" && sha256sum "$name.tgz" > "$name.tgz.sha256")

# the Debian package
mkdir -p "$root/DEBIAN" "$root/usr/lib/cni-reaper" "$root/usr/share/cni-reaper/conflist/1.1.0" \
  "$root/usr/share/cni-reaper/nomad" "$root/usr/share/cni-reaper/monitoring" "$root/usr/share/doc/cni-reaper" \
  "$root/lib/systemd/system"
cp -a "$stage/cni-reaper" "$stage/cni-reaper.lib" "$stage/wrap" "$root/usr/lib/cni-reaper/"
install -m 0644 conflist/*.conflist "$root/usr/share/cni-reaper/conflist/"
install -m 0644 conflist/1.1.0/*.conflist "$root/usr/share/cni-reaper/conflist/1.1.0/"
install -m 0644 conflist/nomad/*.hcl "$root/usr/share/cni-reaper/nomad/"
install -m 0644 "${MONITORING[@]}" "$root/usr/share/cni-reaper/monitoring/"
# the periodic sweep: shipped, never enabled by the package (README, "A periodic sweep")
install -m 0644 conflist/systemd/cni-reaper-sweep.service conflist/systemd/cni-reaper-sweep.timer "$root/lib/systemd/system/"
install -m 0644 README.md "$root/usr/share/doc/cni-reaper/README.md"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: cni-reaper
Version: $version
Architecture: $arch
Maintainer: cni-reaper developers <cni-reaper@users.noreply.github.com>
Installed-Size: $size
Recommends: iptables
Suggests: containernetworking-plugins
Section: net
Priority: optional
Description: chained CNI plugin that removes what dead container networks leave behind
 Sits last in a CNI conflist (Nomad's bridge networking, or any runtime on libcni) and
 removes the netfilter rules, host-local IP reservations and conntrack entries of
 attachments whose network namespace is gone. Self-contained: needs no Python.
 The plugin is /opt/cni/bin/cni-reaper; conflists, Nomad examples, Prometheus
 rules and a Grafana dashboard are in /usr/share/cni-reaper. cni-reaper-sweep.timer
 (not enabled) sweeps every 5 minutes once enabled. Records (/var/lib/cni/reaper)
 and logs stay when it is removed.
CONTROL
# /opt/cni/bin/cni-reaper is made by the maintainer scripts, not shipped: dpkg removes the directories a
# package shipped when they are empty on removal, and /opt belongs to no package (base-files makes it), so a
# shipped link would take /opt (and /opt/cni/bin) away with it. postinst notes the directories it had to
# make; prerm removes the link and exactly those, if empty.
cat > "$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  made=""
  for d in /opt /opt/cni /opt/cni/bin; do
    [ -d "$d" ] || { mkdir -m 0755 "$d"; made="$made $d"; }
  done
  [ -z "$made" ] || echo "$made" >> /usr/lib/cni-reaper/.made-dirs
  link=/opt/cni/bin/cni-reaper
  if [ -L "$link" ] || [ ! -e "$link" ]; then
    ln -sfn /usr/lib/cni-reaper/cni-reaper "$link"
  else
    echo "cni-reaper: $link is not a link (installed by hand or by scripts/install.sh?); left as it is." >&2
    echo "cni-reaper: remove it and run 'dpkg-reconfigure cni-reaper' to use this package's build" >&2
  fi
  # the timer is installed, not enabled: systemctl enable --now cni-reaper-sweep.timer
  if [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null 2>&1 || true; fi
fi
POSTINST
cat > "$root/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ "$1" = remove ]; then
  # the wrapper directory still first in a Nomad client's cni_path: removing it would leave Nomad before 2.0
  # unable to fingerprint any plugin at its next start (a missing cni_path directory ends its scan)
  if [ -z "${CNI_REAPER_FORCE_REMOVE:-}" ] && grep -rsqE '^[[:space:]]*cni_path[[:space:]]*=.*/usr/lib/cni-reaper/wrap' /etc/nomad.d; then
    echo "cni-reaper: /usr/lib/cni-reaper/wrap is in the Nomad client's cni_path ($(grep -rslE 'cni_path.*/usr/lib/cni-reaper/wrap' /etc/nomad.d | head -1))." >&2
    echo "cni-reaper: take it out, restart the Nomad client, then remove the package (or set CNI_REAPER_FORCE_REMOVE=1)" >&2
    exit 1
  fi
fi
if [ "$1" = remove ] || [ "$1" = deconfigure ]; then
  # the timer, if the operator enabled it: stopped, and its link in timers.target.wants removed with the unit
  if [ -d /run/systemd/system ]; then
    systemctl stop cni-reaper-sweep.timer cni-reaper-sweep.service >/dev/null 2>&1 || true
  fi
  wants=/etc/systemd/system/timers.target.wants/cni-reaper-sweep.timer
  if [ -L "$wants" ]; then rm -f "$wants"; fi
  link=/opt/cni/bin/cni-reaper
  if [ "$(readlink "$link" 2>/dev/null)" = /usr/lib/cni-reaper/cni-reaper ]; then rm -f "$link"; fi
  if [ -f /usr/lib/cni-reaper/.made-dirs ]; then
    for d in $(tr ' ' '\n' < /usr/lib/cni-reaper/.made-dirs | sort -r); do rmdir "$d" 2>/dev/null || true; done
    rm -f /usr/lib/cni-reaper/.made-dirs
  fi
fi
PRERM
cat > "$root/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null 2>&1 || true; fi
POSTRM
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
stamp "$root"
SOURCE_DATE_EPOCH=$epoch dpkg-deb --root-owner-group -Zxz --build "$root" "$out/cni-reaper_${version}_$arch.deb" >/dev/null
echo "package.sh: $out/$name.tgz ($(cut -d' ' -f1 "$out/$name.tgz.sha256")), $out/cni-reaper_${version}_$arch.deb ($(sha256sum < "$out/cni-reaper_${version}_$arch.deb" | cut -d' ' -f1))"
