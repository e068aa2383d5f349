#!/usr/bin/env bash
# The host firewall as an nftables table of the program's own (table inet
# hk3s_node), kept across reboots by a oneshot unit of its own.
#
#   firewall_nftables.sh apply RULESET_FILE   check, then load the rendered ruleset in one
#                                              transaction; keep it for the next boot
#   firewall_nftables.sh remove                delete the table, the kept copy and the unit
#
# The ruleset file replaces the table atomically (it deletes and redefines it
# in one `nft -f` transaction), so applying it twice changes nothing and an SSH
# session survives it: established connections are accepted first.
# Prints "result <name> <value>" lines.
set -euo pipefail

kept=/etc/hk3s/host-firewall.nft
unit=/etc/systemd/system/hk3s-host-firewall.service

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
  local tmp="$unit.hk3s-tmp"
  # After nftables.service: its stock /etc/nftables.conf starts with
  # "flush ruleset", which would drop the table if it ran later.
  cat >"$tmp" <<'EOF'
[Unit]
Description=hk3s host firewall (nftables table inet hk3s_node)
DefaultDependencies=no
After=local-fs.target nftables.service
Before=network-pre.target shutdown.target
Wants=network-pre.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=nft -f /etc/hk3s/host-firewall.nft

[Install]
WantedBy=sysinit.target
EOF
  if ! cmp -s "$tmp" "$unit"; then
    mv "$tmp" "$unit"
    systemctl daemon-reload
  else
    rm -f "$tmp"
  fi
  systemctl enable --quiet hk3s-host-firewall.service
}

apply() {
  local ruleset=$1
  [ -r "$ruleset" ] || die "ruleset file $ruleset is missing"
  command -v nft >/dev/null || install_nftables
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
  if command -v nft >/dev/null && nft list table inet hk3s_node >/dev/null 2>&1; then
    nft delete table inet hk3s_node
    echo "result removed table"
  fi
  if [ -e "$unit" ]; then
    systemctl disable --quiet hk3s-host-firewall.service 2>/dev/null || true
    rm -f "$unit"
    systemctl daemon-reload
  fi
  rm -f "$kept"
  echo "result removed yes"
}

case "${1:-}" in
  apply) apply "${2:?usage: firewall_nftables.sh apply RULESET_FILE}" ;;
  remove) remove ;;
  *) die "usage: firewall_nftables.sh apply RULESET_FILE | remove" ;;
esac
