#!/usr/bin/env bash
# The host firewall as an nftables table of the program's own (table inet
# hk3s_node), kept across reboots by a oneshot unit of its own.
#
#   firewall_nftables.sh apply RULESET_FILE   check, then load the rendered ruleset in one
#                                              transaction; keep it for the next boot
#   firewall_nftables.sh remove                delete the table, the kept copy and the unit
#   firewall_nftables.sh apply-guard RULESET_FILE   the same for the DNAT guard table
#   firewall_nftables.sh remove-guard               (inet hk3s_dnat_guard) kept beside UFW or
#                                                   firewalld; prints "result unchanged yes"
#                                                   when the kept copy is the same and loaded
#
# The ruleset file replaces the table atomically (it deletes and redefines it
# in one `nft -f` transaction), so applying it twice changes nothing and an SSH
# session survives it: established connections are accepted first.
# Prints "result <name> <value>" lines.
set -euo pipefail

table=hk3s_node
kept=/etc/hk3s/host-firewall.nft
unit_name=hk3s-host-firewall.service
description="hk3s host firewall (nftables table inet hk3s_node)"

use_guard() {
  table=hk3s_dnat_guard
  kept=/etc/hk3s/dnat-guard.nft
  unit_name=hk3s-dnat-guard.service
  description="hk3s DNAT guard (nftables table inet hk3s_dnat_guard)"
}

die() {
  echo "$*" >&2
  exit 1
}

install_nftables() {
  # Neither UFW nor firewalld is on the host: the program brings nftables.
  if command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nftables >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nftables >/dev/null; }
  elif command -v dnf >/dev/null; then
    dnf install -y -q nftables
  elif command -v zypper >/dev/null; then
    zypper --non-interactive install nftables
  else
    die "nft is missing and no known package manager (apt-get, dnf, zypper) can install it; install nftables"
  fi
  echo "result installed nftables"
}

write_unit() {
  local unit=/etc/systemd/system/$unit_name
  local tmp="$unit.hk3s-tmp"
  # After nftables.service: its stock /etc/nftables.conf starts with
  # "flush ruleset", which would drop the table if it ran later.
  cat >"$tmp" <<EOF
[Unit]
Description=$description
DefaultDependencies=no
After=local-fs.target nftables.service
Before=network-pre.target shutdown.target
Wants=network-pre.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=nft -f $kept

[Install]
WantedBy=sysinit.target
EOF
  if ! cmp -s "$tmp" "$unit"; then
    mv "$tmp" "$unit"
    systemctl daemon-reload
  else
    rm -f "$tmp"
  fi
  systemctl enable --quiet "$unit_name"
}

apply() {
  local ruleset=$1
  [ -r "$ruleset" ] || die "ruleset file $ruleset is missing"
  command -v nft >/dev/null || install_nftables
  if [ "$table" = hk3s_dnat_guard ] && cmp -s "$ruleset" "$kept" && nft list table inet "$table" >/dev/null 2>&1 &&
    { [ ! -d /run/systemd/system ] || systemctl is-enabled --quiet "$unit_name"; }; then
    rm -f "$ruleset"
    echo "result unchanged yes"
    return
  fi
  # Check mode first: a ruleset the kernel refuses leaves the host as it was.
  nft -c -f "$ruleset" || die "nft refused the rendered ruleset (nothing changed)"
  nft -f "$ruleset"
  mkdir -p "$(dirname "$kept")"
  install -m 0600 "$ruleset" "$kept.hk3s-tmp"
  mv "$kept.hk3s-tmp" "$kept"
  if [ -d /run/systemd/system ]; then
    write_unit
    echo "result persisted unit"
  else
    echo "result persisted file"
  fi
  rm -f "$ruleset"
  echo "result applied yes"
}

remove() {
  local unit=/etc/systemd/system/$unit_name
  if command -v nft >/dev/null && nft list table inet "$table" >/dev/null 2>&1; then
    nft delete table inet "$table"
    echo "result removed table"
  fi
  if [ -e "$unit" ]; then
    systemctl disable --quiet "$unit_name" 2>/dev/null || true
    rm -f "$unit"
    systemctl daemon-reload
  fi
  rm -f "$kept"
  echo "result removed yes"
}

case "${1:-}" in
  apply) apply "${2:?usage: firewall_nftables.sh apply RULESET_FILE}" ;;
  remove) remove ;;
  apply-guard)
    use_guard
    apply "${2:?usage: firewall_nftables.sh apply-guard RULESET_FILE}"
    ;;
  remove-guard)
    use_guard
    remove
    ;;
  *) die "usage: firewall_nftables.sh apply|apply-guard RULESET_FILE | remove|remove-guard" ;;
esac
