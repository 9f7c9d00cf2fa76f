#!/usr/bin/env bash
# Install cni-reaper on a Nomad client (as root), or into a throwaway root with --prefix.
#
#   scripts/install.sh [--prefix DIR] [--bundle DIR] [--conflist FILE|none] [--cni-version auto|1.0.0|1.1.0] [--force]
#                      [--timer] [--wrap]
#   scripts/install.sh [--prefix DIR] --uninstall
#
# Installs the one-folder bundle into /opt/cni-reaper/, links /opt/cni/bin/cni-reaper to it, copies the
# conflist (default conflist/nomad-reaper.conflist) into /opt/cni/config/, and checks that the reference
# plugins the conflist chains are present (in /opt/cni/bin or /usr/lib/cni). A shipped conflist is
# installed in its CNI 1.1.0 form (conflist/1.1.0/) when every plugin it chains says it speaks 1.1.0 (CNI
# VERSION; plugins 1.6 and later), so that Nomad 1.9.5+ sends STATUS; otherwise in its 1.0.0 form.
# --timer also installs the periodic sweep, cni-reaper-sweep.timer and .service, into /etc/systemd/system,
# not enabled (systemctl enable --now cni-reaper-sweep.timer; see README, "A periodic sweep").
# --wrap also makes /opt/cni-reaper/wrap/, a directory holding a link `portmap` to cni-reaper (wrap mode, for
# Nomad's own bridge network: see README, "Nomad's bridge network (no job change)"), checks that a real portmap
# follows it on the path, and prints the cni_path line for the Nomad client; nothing changes until that line
# is in the client's configuration. Roll back: take the directory out of cni_path (and restart the client).
# Idempotent. What it installed is listed in /opt/cni-reaper/.manifest; --uninstall removes exactly that and
# nothing else (not the records in /var/lib/cni/reaper, not the log).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

prefix="" bundle="" conflist="$here/conflist/nomad-reaper.conflist" uninstall=0 force=0 cni_version=auto timer=0 wrap=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=${2%/}; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    --conflist) conflist=$2; shift 2 ;;
    --uninstall) uninstall=1; shift ;;
    --force) force=1; shift ;;
    --cni-version) cni_version=$2; shift 2 ;;
    --timer) timer=1; shift ;;
    --wrap) wrap=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

home="$prefix/opt/cni-reaper"
bindir="$prefix/opt/cni/bin"
confdir="$prefix/opt/cni/config"
link="$bindir/cni-reaper"
manifest="$home/.manifest"
say() { echo "install.sh: $*"; }

# --timer: the systemd units, copied (not enabled) and listed in the manifest like a conflist, so that
# --uninstall removes them (and the directories it had to make) unless they were changed
install_timer() {
  local unitdir="$prefix/etc/systemd/system" unit dest made=()
  for d in "$prefix/etc" "$prefix/etc/systemd" "$unitdir"; do
    [ -d "$d" ] || { mkdir -p "$d"; made+=("${d#"$prefix"}"); }
  done
  for unit in cni-reaper-sweep.service cni-reaper-sweep.timer; do
    dest="$unitdir/$unit"
    if [ -f "$dest" ] && ! cmp -s "$here/conflist/systemd/$unit" "$dest" && [ "$force" != 1 ]; then
      echo "install.sh: $dest exists with other content; use --force to replace it" >&2; exit 1
    fi
    install -m 0644 "$here/conflist/systemd/$unit" "$dest"
    grep -v "^file /etc/systemd/system/$unit " "$manifest" > "$manifest.new" || true
    mv "$manifest.new" "$manifest"
    printf 'file %s %s\n' "/etc/systemd/system/$unit" "$(sha256sum < "$dest" | cut -d' ' -f1)" >> "$manifest"
  done
  for d in "${made[@]}"; do grep -qx "dir $d" "$manifest" || printf 'dir %s\n' "$d" >> "$manifest"; done
  if [ -z "$prefix" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
  say "installed cni-reaper-sweep.timer and .service into ${prefix}/etc/systemd/system, not enabled:"
  say "  systemctl enable --now cni-reaper-sweep.timer"
}

# before --uninstall removes the units: stop and disable the timer (an enabled timer's link in
# timers.target.wants would be left pointing at nothing)
uninstall_timer() {
  grep -q '^file /etc/systemd/system/cni-reaper-sweep.timer ' "$manifest" || return 0
  if [ -z "$prefix" ] && [ -d /run/systemd/system ]; then
    systemctl disable --now cni-reaper-sweep.timer >/dev/null 2>&1 || true
    systemctl stop cni-reaper-sweep.service >/dev/null 2>&1 || true
  fi
  local wants="$prefix/etc/systemd/system/timers.target.wants"
  if [ -L "$wants/cni-reaper-sweep.timer" ]; then rm -f "$wants/cni-reaper-sweep.timer"; rmdir "$wants" 2>/dev/null || true; fi
}

# --wrap: the wrapper directory lives in the bundle's home (made with it, before the swap, so that an upgrade
# never shows a client a cni_path directory without its portmap) and goes with it
install_wrap() {
  say "wrapper directory /opt/cni-reaper/wrap (portmap -> cni-reaper, which runs $real_portmap)"
  say "to wrap Nomad's bridge network, put it first in the client's cni_path and restart the client:"
  say "  cni_path = \"/opt/cni-reaper/wrap:/opt/cni/bin:/usr/lib/cni\""
  say "  (roll back: take /opt/cni-reaper/wrap out of cni_path again; cni-reaper doctor checks the wrap)"
}

# the wrapper directory named in a Nomad client's cni_path: removing it would leave Nomad before 2.0 unable to
# fingerprint any plugin at its next start (a missing cni_path directory ends its scan)
wrap_in_use() {
  grep -rslE '^[[:space:]]*cni_path[[:space:]]*=.*/opt/cni-reaper/wrap' "$prefix/etc/nomad.d" 2>/dev/null | head -1
}

if [ "$uninstall" = 1 ]; then
  if [ ! -f "$manifest" ]; then say "nothing to uninstall ($manifest not found)"; exit 0; fi
  if [ -d "$home/wrap" ] && [ "$force" != 1 ] && in_use=$(wrap_in_use) && [ -n "$in_use" ]; then
    echo "install.sh: /opt/cni-reaper/wrap is in the Nomad client's cni_path ($in_use)" >&2
    echo "  take it out and restart the Nomad client first (or use --force)" >&2
    exit 1
  fi
  uninstall_timer
  dirs=$(grep '^dir ' "$manifest" | cut -d' ' -f2 | sort -r || true)
  while read -r kind path sum; do
    case "$kind" in
      link) if [ -L "$prefix$path" ] && [ "$(readlink "$prefix$path")" = "$sum" ]; then rm -f "$prefix$path"; say "removed $path"
            else say "left $path: it is not the link this script made"; fi ;;
      file) if [ -f "$prefix$path" ] && [ "$(sha256sum < "$prefix$path" | cut -d' ' -f1)" = "$sum" ]; then rm -f "$prefix$path"; say "removed $path"
            elif [ -e "$prefix$path" ]; then say "left $path: it was changed after installation"; fi ;;
    esac
  done < "$manifest"
  rm -rf "$home"
  say "removed /opt/cni-reaper"
  for d in $dirs; do rmdir "$prefix$d" 2>/dev/null && say "removed empty $d" || true; done
  if [ -z "$prefix" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
  exit 0
fi

if [ -z "$bundle" ]; then
  bundle="$here/dist/cni-reaper"
  [ -x "$bundle/cni-reaper" ] || "$here/scripts/build.sh"
fi
[ -x "$bundle/cni-reaper" ] || { echo "install.sh: no bundle at $bundle (run scripts/build.sh)" >&2; exit 1; }

# the plugin types a conflist chains (ipam types too), read without Python (a client may have none)
types_of() { grep -o '"type"[[:space:]]*:[[:space:]]*"[^"]*"' "$1" | sed 's/.*"\([^"]*\)"$/\1/' | sort -u; }
# where Nomad's cni_path would find a plugin (default cni_path: /opt/cni/bin, then /usr/lib/cni here)
plugin_path() { for d in "$bindir" /usr/lib/cni; do [ -x "$d/$1" ] && { echo "$d/$1"; return 0; }; done; return 1; }
speaks_1_1_0() { CNI_COMMAND=VERSION "$1" </dev/null 2>/dev/null | grep -q '"1\.1\.0"'; }

# the reference plugins the conflist chains must be where Nomad looks for them
if [ "$conflist" != none ]; then
  [ -f "$conflist" ] || { echo "install.sh: no conflist $conflist" >&2; exit 1; }
  missing=() old=()
  for t in $(types_of "$conflist"); do
    [ "$t" = cni-reaper ] && continue
    if p=$(plugin_path "$t"); then speaks_1_1_0 "$p" || old+=("$t"); else missing+=("$t"); fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install.sh: the conflist chains plugins that are not installed: ${missing[*]}" >&2
    echo "  install them (Debian: apt-get install containernetworking-plugins) into /opt/cni/bin or /usr/lib/cni," >&2
    echo "  and list that directory in the Nomad client's cni_path" >&2
    exit 1
  fi
  # a shipped conflist comes in two forms: conflist/NAME (CNI 1.0.0) and conflist/1.1.0/NAME
  name=$(basename "$conflist")
  if [ "$(cd "$(dirname "$conflist")" && pwd)" = "$here/conflist" ] && [ -f "$here/conflist/1.1.0/$name" ]; then
    case "$cni_version" in
      auto) if [ ${#old[@]} -eq 0 ]; then cni_version=1.1.0; why="every plugin it chains speaks CNI 1.1.0"
            else cni_version=1.0.0; why="${old[*]} do(es) not speak CNI 1.1.0 (plugins before 1.6)"; fi ;;
      1.0.0|1.1.0) why="asked for with --cni-version" ;;
      *) echo "install.sh: --cni-version must be auto, 1.0.0 or 1.1.0" >&2; exit 2 ;;
    esac
    [ "$cni_version" = 1.1.0 ] && conflist="$here/conflist/1.1.0/$name"
    say "conflist $name in its CNI $cni_version form: $why"
    [ "$cni_version" = 1.1.0 ] || say "  (Nomad 1.9.5+ sends STATUS only to conflists at 1.1.0; see docs/compatibility.md)"
  fi
fi

[ -f "$home/.wrap" ] && wrap=1  # a wrap once installed stays until --uninstall (cni_path may name it)
if [ "$wrap" = 1 ] && ! real_portmap=$(plugin_path portmap); then
  echo "install.sh: --wrap: no portmap plugin in $bindir or /usr/lib/cni for the wrapper to run" >&2
  echo "  install the reference plugins (Debian: apt-get install containernetworking-plugins) first" >&2
  exit 1
fi

created=()
for d in "$prefix/opt" "$prefix/opt/cni" "$bindir" "$confdir"; do
  [ -d "$d" ] || { mkdir -p "$d"; created+=("${d#"$prefix"}"); }
done
# directories made by an earlier run of this script stay ours
prev_dirs=$(grep '^dir ' "$manifest" 2>/dev/null | cut -d' ' -f2 || true)
# so do conflists installed by an earlier run (another conflist, or this one before it is replaced below)
prev_files=$(grep '^file ' "$manifest" 2>/dev/null || true)
# the bundle: copied beside, then swapped in, so a running invocation never sees half a bundle
rm -rf "$home.new"
cp -a "$bundle" "$home.new"
rm -rf "$home.new/wrap"  # the release's wrapper directory: made with --wrap only, before the swap
if [ "$wrap" = 1 ]; then
  mkdir "$home.new/wrap" && ln -s ../cni-reaper "$home.new/wrap/portmap" && printf 'wrap\n' > "$home.new/.wrap"
fi
rm -rf "$home.old"
[ -d "$home" ] && mv "$home" "$home.old"
mv "$home.new" "$home"
rm -rf "$home.old"

target="../../cni-reaper/cni-reaper"  # relative: valid both in / and in a prefix
if [ -e "$link" ] && [ ! -L "$link" ] && [ "$force" != 1 ]; then
  echo "install.sh: $link exists and is not a link; move it away or use --force" >&2; exit 1
fi
ln -sfn "$target" "$link"
printf 'link %s %s\n' /opt/cni/bin/cni-reaper "$target" > "$manifest"
for d in $prev_dirs "${created[@]}"; do printf 'dir %s\n' "$d" >> "$manifest"; done
if [ "$conflist" != none ]; then
  prev_files=$(printf '%s\n' "$prev_files" | grep -v "^file /opt/cni/config/$(basename "$conflist") " || true)
fi
[ -n "$prev_files" ] && printf '%s\n' "$prev_files" >> "$manifest"

if [ "$conflist" != none ]; then
  dest="$confdir/$(basename "$conflist")"
  if [ -f "$dest" ] && ! cmp -s "$conflist" "$dest" && [ "$force" != 1 ]; then
    echo "install.sh: $dest exists with other content; use --force to replace it" >&2; exit 1
  fi
  install -m 0644 "$conflist" "$dest"
  printf 'file %s %s\n' "/opt/cni/config/$(basename "$conflist")" "$(sha256sum < "$dest" | cut -d' ' -f1)" >> "$manifest"
fi
[ "$timer" = 1 ] && install_timer
[ "$wrap" = 1 ] && install_wrap
what="/opt/cni-reaper, /opt/cni/bin/cni-reaper"
[ "$conflist" = none ] || what="$what and /opt/cni/config/$(basename "$conflist")"
say "installed $what under ${prefix:-/}"
"$link" version
