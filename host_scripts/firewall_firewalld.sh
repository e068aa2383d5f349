#!/usr/bin/env bash
# The host firewall through firewalld: two zones of the program's own, made the
# default, and ipsets for the peers.
#
#   firewall_firewalld.sh apply STAGING_DIR MODE   install STAGING_DIR/zones/*.xml and
#                                                   STAGING_DIR/ipsets/*.xml as the permanent
#                                                   config, check it, then one reload; MODE
#                                                   "if-changed" skips all that when the files
#                                                   are in place already, "reload" does not
#   firewall_firewalld.sh remove               restore the previous default zone, delete the
#                                              program's zones and ipsets, reload
#
# Zones: "hk3s" (the node's ports and the peers' rich rules) becomes the
# default zone, so every interface not bound elsewhere uses it; "hk3s-fabric"
# (target ACCEPT) holds the cluster's own interfaces (cni0, flannel.1, ...).
# Nothing is live until the single reload, which firewalld applies as one
# ruleset; established connections (this SSH session) stay accepted. A config
# firewalld refuses is rolled back before the reload.
# Prints "result <name> <value>" lines.
set -euo pipefail

state_dir=/var/lib/hk3s/firewall
conf_dir=/etc/firewalld
conf=$conf_dir/firewalld.conf

die() {
  echo "$*" >&2
  exit 1
}

running() { firewall-cmd --state >/dev/null 2>&1; }

configured_default_zone() { sed -n 's/^DefaultZone=//p' "$conf" 2>/dev/null | tail -n 1; }

set_default_zone() {
  local zone=$1
  local tmp="$conf.hk3s-tmp"
  # awk -v, not sed: the zone name stays a value, never part of a program.
  awk -v zone="$zone" '
    /^DefaultZone=/ { print "DefaultZone=" zone; done = 1; next }
    { print }
    END { if (!done) print "DefaultZone=" zone }' "$conf" >"$tmp"
  chmod --reference="$conf" "$tmp"
  mv "$tmp" "$conf"
}

check_config() {
  if command -v firewall-offline-cmd >/dev/null; then
    firewall-offline-cmd --check-config
  else
    firewall-cmd --check-config
  fi
}

# Our files now on the host, relative to $conf_dir.
installed_files() {
  local path
  for path in "$conf_dir"/zones/hk3s.xml "$conf_dir"/zones/hk3s-fabric.xml "$conf_dir"/ipsets/hk3s-*.xml; do
    [ -e "$path" ] && printf '%s\n' "${path#"$conf_dir"/}"
  done
  return 0
}

staged_files() {
  local staging=$1 path
  for path in "$staging"/zones/*.xml "$staging"/ipsets/*.xml; do
    [ -e "$path" ] && printf '%s\n' "${path#"$staging"/}"
  done
  return 0
}

apply() {
  local staging=$1 mode=$2 rel current changed=no
  command -v firewall-cmd >/dev/null || die "firewalld is not installed"
  [ -r "$staging/zones/hk3s.xml" ] || die "staged zone $staging/zones/hk3s.xml is missing"
  mkdir -p "$state_dir"

  current=$(configured_default_zone)
  if running; then current=$(firewall-cmd --get-default-zone); fi
  if [ ! -e "$state_dir/firewalld-previous-default-zone" ] && [ -n "$current" ] && [ "$current" != hk3s ]; then
    printf '%s\n' "$current" >"$state_dir/firewalld-previous-default-zone"
  fi

  while IFS= read -r rel; do
    cmp -s "$staging/$rel" "$conf_dir/$rel" || changed=yes
  done < <(staged_files "$staging")
  while IFS= read -r rel; do
    [ -e "$staging/$rel" ] || changed=yes
  done < <(installed_files)
  [ "$(configured_default_zone)" = hk3s ] || changed=yes
  [ "$mode" = if-changed ] || changed=yes
  if [ "$changed" = no ] && running && [ "$(firewall-cmd --get-default-zone)" = hk3s ]; then
    rm -rf "$staging"
    echo "result unchanged yes"
    return
  fi

  # Keep what is there, to roll back to if firewalld refuses the new config.
  local backup="$state_dir/firewalld-backup"
  rm -rf "$backup"
  mkdir -p "$backup/zones" "$backup/ipsets"
  while IFS= read -r rel; do cp -p "$conf_dir/$rel" "$backup/$rel"; done < <(installed_files)
  cp -p "$conf" "$backup/firewalld.conf" 2>/dev/null || true

  while IFS= read -r rel; do rm -f "$conf_dir/$rel"; done < <(installed_files)
  mkdir -p "$conf_dir/zones" "$conf_dir/ipsets"
  while IFS= read -r rel; do
    install -m 0644 "$staging/$rel" "$conf_dir/$rel"
  done < <(staged_files "$staging")
  set_default_zone hk3s

  local check_output
  if ! check_output=$(check_config 2>&1); then
    while IFS= read -r rel; do rm -f "$conf_dir/$rel"; done < <(installed_files)
    (cd "$backup" && find zones ipsets -name '*.xml') | while IFS= read -r rel; do cp -p "$backup/$rel" "$conf_dir/$rel"; done
    [ -e "$backup/firewalld.conf" ] && cp -p "$backup/firewalld.conf" "$conf"
    die "firewalld refused the new config, which was rolled back (nothing changed): ${check_output//$'\n'/ }"
  fi

  if running; then
    firewall-cmd --reload >/dev/null
    echo "result reloaded yes"
  else
    touch "$state_dir/firewalld-started-by-hk3s"
    systemctl enable --now firewalld >/dev/null 2>&1 || die "firewalld did not start; see journalctl -u firewalld"
    echo "result started yes"
  fi
  [ "$(firewall-cmd --get-default-zone)" = hk3s ] || die "firewalld's default zone is not hk3s after the reload"
  rm -rf "$staging" "$backup"
  echo "result applied yes"
}

remove() {
  if ! command -v firewall-cmd >/dev/null; then
    echo "result removed yes"
    return
  fi
  local previous=public
  if [ -r "$state_dir/firewalld-previous-default-zone" ]; then
    previous=$(cat "$state_dir/firewalld-previous-default-zone")
  fi
  if [ "$(configured_default_zone)" = hk3s ]; then set_default_zone "$previous"; fi
  rm -f "$conf_dir"/zones/hk3s.xml "$conf_dir"/zones/hk3s.xml.old "$conf_dir"/zones/hk3s-fabric.xml \
    "$conf_dir"/zones/hk3s-fabric.xml.old "$conf_dir"/ipsets/hk3s-*.xml "$conf_dir"/ipsets/hk3s-*.xml.old
  if running; then
    firewall-cmd --reload >/dev/null
    echo "result reloaded yes"
  fi
  if [ -e "$state_dir/firewalld-started-by-hk3s" ]; then
    systemctl disable --now firewalld >/dev/null 2>&1 || true
    rm -f "$state_dir/firewalld-started-by-hk3s"
    echo "result stopped yes"
  fi
  rm -f "$state_dir/firewalld-previous-default-zone"
  echo "result removed yes"
}

case "${1:-}" in
  apply) apply "${2:?usage: firewall_firewalld.sh apply STAGING_DIR if-changed|reload}" "${3:?MODE is missing}" ;;
  remove) remove ;;
  *) die "usage: firewall_firewalld.sh apply STAGING_DIR if-changed|reload | remove" ;;
esac
