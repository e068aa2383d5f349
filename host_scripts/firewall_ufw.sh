#!/usr/bin/env bash
# The host firewall through UFW: adds and deletes the program's own rules
# (their comment starts with "hk3s"), never anyone else's.
#
#   firewall_ufw.sh apply CHANGES_FILE SSH_PORT   run the changes in file order, make incoming
#                                                  traffic denied by default, enable UFW
#   firewall_ufw.sh remove CHANGES_FILE           run the (delete) changes; disable UFW again
#                                                  if this program enabled it
#
# CHANGES_FILE has one change per line, tab-separated:
#   add|delete  port|in|route_in  PROTO  PORT  SOURCE  INTERFACE  COMMENT
# ("-" for a field that does not apply). UFW has no transaction, so the caller
# orders the file to keep the window small: SSH first, additions before
# deletions. UFW is enabled only once an SSH rule for SSH_PORT is in place.
# Prints "result <name> <value>" lines.
set -euo pipefail

state_dir=/var/lib/hk3s/firewall

die() {
  echo "$*" >&2
  exit 1
}

ufw_active() { ufw status | head -n 1 | grep -q '^Status: active'; }

run_changes() {
  local file=$1 op kind proto port source iface comment
  local -a argv
  local count=0
  while IFS=$'\t' read -r op kind proto port source iface comment || [ -n "$op" ]; do
    [ -n "$op" ] || continue
    # Routed rules are "ufw route [delete] allow ...", the others "ufw [delete] allow ...".
    argv=(ufw)
    [ "$kind" = route_in ] && argv+=(route)
    case "$op" in
      add) ;;
      delete) argv+=(delete) ;;
      *) die "change line with unknown operation '$op' in $file" ;;
    esac
    case "$kind" in
      port) argv+=(allow proto "$proto" from "$source" to any port "$port") ;;
      in | route_in) argv+=(allow in on "$iface") ;;
      *) die "change line with unknown kind '$kind' in $file" ;;
    esac
    # UFW matches a deletion on the rule alone; a comment that differs would make it fail.
    if [ "$op" = add ]; then argv+=(comment "$comment"); fi
    "${argv[@]}" >/dev/null || die "'${argv[*]}' failed"
    count=$((count + 1))
  done <"$file"
  echo "result changes $count"
}

ssh_allowed() {
  local ssh_port=$1
  # A tuple "allow tcp <port> <dst> <sport> 0.0.0.0/0 in": SSH from anywhere.
  awk -v port="$ssh_port" '
    /^### tuple ### / {
      if ($4 ~ /^(allow|limit)$/ && ($5 == "tcp" || $5 == "any") && $6 == port && $9 == "0.0.0.0/0" && $10 ~ /^in/) found = 1
    }
    END { exit found ? 0 : 1 }' /etc/ufw/user.rules
}

# UFW with IPV6=no loads no IPv6 rules at all: with IPv6 on in the kernel, every port stays
# open over IPv6 (link-local from the same segment at least), whatever the rules say.
ipv6_unfiltered() {
  grep -qiE '^[[:space:]]*IPV6="?no"?[[:space:]]*$' /etc/default/ufw 2>/dev/null &&
    [ "$(cat /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null || echo 1)" = 0 ]
}

apply() {
  local file=$1 ssh_port=$2
  command -v ufw >/dev/null || die "ufw is not installed"
  [ -r "$file" ] || die "changes file $file is missing"
  if ipv6_unfiltered; then
    # The caller refuses first (from its inspection); this holds if the file changed since.
    die "UFW filters no IPv6 on this host (IPV6=no in /etc/default/ufw) while IPv6 is on in its kernel, so every port is open over IPv6: set IPV6=yes there and run 'ufw reload' (or turn IPv6 off: sysctl net.ipv6.conf.all.disable_ipv6=1), then run again; nothing was changed"
  fi
  mkdir -p "$state_dir"
  run_changes "$file"
  ssh_allowed "$ssh_port" || die "no UFW rule allows SSH port $ssh_port from anywhere; UFW left as it was"
  local policy
  policy=$(sed -n 's/^DEFAULT_INPUT_POLICY="\{0,1\}\([A-Z]*\)"\{0,1\}$/\1/p' /etc/default/ufw)
  if [ "$policy" != DROP ] && [ "$policy" != REJECT ]; then
    [ -e "$state_dir/ufw-previous-default-input" ] || printf '%s\n' "$policy" >"$state_dir/ufw-previous-default-input"
    ufw default deny incoming >/dev/null
    echo "result default_input deny"
  fi
  if ! ufw_active; then
    touch "$state_dir/ufw-enabled-by-hk3s"
    ufw --force enable >/dev/null
    echo "result enabled yes"
  fi
  rm -f "$file"
  echo "result applied yes"
}

remove() {
  local file=$1
  command -v ufw >/dev/null || {
    echo "result removed yes"
    return
  }
  run_changes "$file"
  if [ -e "$state_dir/ufw-previous-default-input" ]; then
    case "$(cat "$state_dir/ufw-previous-default-input")" in
      ACCEPT) ufw default allow incoming >/dev/null ;;
      *) ;;
    esac
    rm -f "$state_dir/ufw-previous-default-input"
  fi
  if [ -e "$state_dir/ufw-enabled-by-hk3s" ]; then
    ufw --force disable >/dev/null
    rm -f "$state_dir/ufw-enabled-by-hk3s"
    echo "result disabled yes"
  fi
  rm -f "$file"
  echo "result removed yes"
}

case "${1:-}" in
  apply) apply "${2:?usage: firewall_ufw.sh apply CHANGES_FILE SSH_PORT}" "${3:?SSH_PORT is missing}" ;;
  remove) remove "${2:?usage: firewall_ufw.sh remove CHANGES_FILE}" ;;
  *) die "usage: firewall_ufw.sh apply CHANGES_FILE SSH_PORT | remove CHANGES_FILE" ;;
esac
