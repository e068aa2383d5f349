#!/usr/bin/env bash
# Reads the host's firewall: which of UFW, firewalld and nftables is there and
# running, and the state of each (UFW's rule tuples, firewalld's runtime zones,
# ipsets and policies, the whole nftables ruleset as JSON). Changes nothing.
#
#   firewall_inspect.sh            what managing the node's firewall needs
#   firewall_inspect.sh operator   also firewalld's policies, services and every
#                                  ipset, to check a firewall the operator runs
#                                  (each firewall-cmd call costs a few tenths of a second)
#
# Prints "fact <name> <value>" lines, "data <section> <raw line>" lines for
# multi-line output, and "fact complete yes" last, so a cut-off run is noticed.
set -euo pipefail

mode=${1:-managed}

# Where the firewall scripts keep what they must remember between runs.
state_dir=/var/lib/hk3s/firewall

fact() { printf 'fact %s %s\n' "$1" "$2"; }
data() {
  local section=$1 line
  while IFS= read -r line || [ -n "$line" ]; do
    printf 'data %s %s\n' "$section" "$line"
  done
}
have() { command -v "$1" >/dev/null 2>&1; }
yes_no() { if "$@"; then echo yes; else echo no; fi; }

# The port this SSH session came in on, as the host sees it: the firewall must
# keep it open whatever the plan's SSH port is.
read -r _ _ _ session_port _ <<<"${SSH_CONNECTION:-- - - -}" || true
fact ssh_port "${session_port:--}"

ip -o addr show scope global | while read -r _ iface family cidr _; do
  case "$family" in inet | inet6) fact address "$iface $cidr" ;; esac
done
default_dev=$(ip -4 route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
fact default_route_interface "${default_dev:--}"

# --- UFW: its rule tuples are the machine-readable record of every rule.
if have ufw; then
  fact ufw installed
  # `ufw status` needs root and reads the live state; the first line says it.
  if ufw status 2>/dev/null | head -n 1 | grep -q '^Status: active'; then
    fact ufw_active yes
  else
    fact ufw_active no
  fi
  policy=$(sed -n 's/^DEFAULT_INPUT_POLICY="\{0,1\}\([A-Z]*\)"\{0,1\}$/\1/p' /etc/default/ufw 2>/dev/null || true)
  fact ufw_default_input "${policy:-unknown}"
  # IPV6=no: UFW loads no IPv6 rules at all; it matters only while IPv6 is on in the kernel.
  if grep -qiE '^[[:space:]]*IPV6="?no"?[[:space:]]*$' /etc/default/ufw 2>/dev/null &&
    [ "$(cat /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null || echo 1)" = 0 ]; then
    fact ufw_ipv6_unfiltered yes
  else
    fact ufw_ipv6_unfiltered no
  fi
  for family in v4 v6; do
    file=/etc/ufw/user.rules
    [ "$family" = v6 ] && file=/etc/ufw/user6.rules
    if [ -r "$file" ]; then
      sed -n 's/^### tuple ### //p' "$file" | data "ufw_$family"
    fi
  done
  fact ufw_enabled_by_hk3s "$(yes_no test -e "$state_dir/ufw-enabled-by-hk3s")"
else
  fact ufw absent
fi

# --- firewalld: runtime state, read through firewall-cmd while it runs.
if have firewall-cmd; then
  fact firewalld installed
  # Every firewall-cmd call starts a Python interpreter: one call both tells
  # whether firewalld runs (it refuses every query but --state when it does not)
  # and reads the default zone.
  if default_zone=$(firewall-cmd --get-default-zone 2>/dev/null); then
    fact firewalld_running yes
    fact firewalld_default_zone "$default_zone"
    zones=$(firewall-cmd --list-all-zones)
    printf '%s\n' "$zones" | data firewalld_zones
    for ipset in $(firewall-cmd --get-ipsets); do
      case "$mode:$ipset" in
        operator:* | *:hk3s-*) firewall-cmd --info-ipset="$ipset" | data "firewalld_ipset:$ipset" ;;
      esac
    done
    if [ "$mode" = operator ]; then
      # Policies exist from firewalld 0.9; older versions have none to report.
      policies=$(firewall-cmd --list-all-policies 2>/dev/null || true)
      printf '%s\n' "$policies" | data firewalld_policies
      # Only the services the zones and policies use: asking for all is slow.
      services=$(printf '%s\n%s\n' "$zones" "$policies" | sed -n 's/^  services: //p' | tr ' ' '\n' | sort -u)
      for service in $services; do
        firewall-cmd --info-service="$service" | data "firewalld_service:$service"
      done
    fi
  else
    fact firewalld_running no
  fi
  if [ -r "$state_dir/firewalld-previous-default-zone" ]; then
    fact firewalld_previous_default_zone "$(cat "$state_dir/firewalld-previous-default-zone")"
  fi
else
  fact firewalld absent
fi

# --- nftables: the whole ruleset (iptables-nft rules included) as one JSON line.
if have nft; then
  fact nft installed
  ruleset=$(nft -j list ruleset 2>/dev/null || true)
  if [ -n "$ruleset" ]; then
    printf '%s\n' "$ruleset" | data nft_json
  fi
  fact nft_persisted "$(yes_no test -e /etc/hk3s/host-firewall.nft)"
  fact nft_guard_persisted "$(yes_no test -e /etc/hk3s/dnat-guard.nft)"
else
  fact nft absent
fi
fact complete yes
