#!/usr/bin/env bash
# Prepares a host for k3s: kernel modules, sysctls, kubelet file hardening,
# Longhorn's packages, SSH hardening. Idempotent: each step records itself in
# /var/lib/hk3s/journal and is skipped on a rerun; a host rebooted mid-way
# converges on the next run.
#   node_prepare.sh POD_NETWORK          (wireguard or vxlan)
set -euo pipefail

pod_network=$1
journal=/var/lib/hk3s/journal
mkdir -p "$journal"

result() { printf 'result %s %s\n' "$1" "$2"; }
fail() {
  printf 'error %s\n' "$1" >&2
  exit 1
}
# done_before NAME KEY: true when step NAME already ran with the same KEY.
done_before() { [ -f "$journal/prepare-$1" ] && [ "$(cat "$journal/prepare-$1")" = "$2" ]; }
mark_done() { printf '%s\n' "$2" >"$journal/prepare-$1"; }

# shellcheck disable=SC1091
. /etc/os-release

# A module counts as present when loaded or built into the kernel: built-in ones
# have no /sys/module entry unless they take parameters, so look at what they provide.
module_present() {
  case "$1" in
    br_netfilter) [ -d /proc/sys/net/bridge ] ;;
    overlay) grep -qw overlay /proc/filesystems ;;
    *) [ -d "/sys/module/$1" ] ;;
  esac
}

# --- kernel modules -----------------------------------------------------------
modules=(overlay br_netfilter)
[ "$pod_network" = wireguard ] && modules+=(wireguard)
key="${modules[*]}"
if done_before modules "$key" && [ -f /etc/modules-load.d/hk3s.conf ]; then
  result modules skipped
else
  for module in "${modules[@]}"; do
    if ! module_present "$module"; then
      modprobe "$module" 2>/dev/null || fail "kernel module $module is neither loaded nor loadable; install it or use another kernel"
    fi
  done
  printf '%s\n' "${modules[@]}" >/etc/modules-load.d/hk3s.conf
  mark_done modules "$key"
  result modules applied
fi

# --- sysctls ------------------------------------------------------------------
sysctl_file=/etc/sysctl.d/90-hk3s.conf
sysctl_text="net.ipv4.ip_forward = 1
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1"
if done_before sysctls "$(printf '%s' "$sysctl_text" | sha256sum | cut -c1-16)"; then
  result sysctls skipped
else
  printf '%s\n' "$sysctl_text" >"$sysctl_file"
  while IFS=' =' read -r name value; do
    current=$(sysctl -n "$name" 2>/dev/null || echo missing)
    if [ "$current" != "$value" ]; then
      sysctl -q -w "$name=$value" >/dev/null 2>&1 || fail "cannot set $name=$value (it is $current)"
    fi
  done <<<"$sysctl_text"
  mark_done sysctls "$(printf '%s' "$sysctl_text" | sha256sum | cut -c1-16)"
  result sysctls applied
fi

# --- kubelet hardening: k3s's own files readable by root only -----------------------
if [ "$(stat -c %a /etc/rancher/k3s /var/lib/rancher/k3s 2>/dev/null)" = "700
700" ]; then
  result kubelet-hardening skipped
else
  mkdir -p /etc/rancher/k3s /var/lib/rancher/k3s
  chmod 0700 /etc/rancher/k3s /var/lib/rancher/k3s
  result kubelet-hardening applied
fi

# --- Longhorn's packages (iSCSI initiator, NFS client) -----------------------------
case "$ID" in
  debian | ubuntu) packages=(open-iscsi nfs-common) ;;
  rocky | almalinux | rhel | centos) packages=(iscsi-initiator-utils nfs-utils) ;;
  *) fail "no Longhorn package list for $ID" ;;
esac
if done_before longhorn-packages "${packages[*]}"; then
  result longhorn-packages skipped
else
  case "$ID" in
    debian | ubuntu)
      export DEBIAN_FRONTEND=noninteractive
      installed=$(dpkg-query -W -f='${Status}\n' "${packages[@]}" 2>/dev/null | grep -c "ok installed" || true)
      if [ "$installed" != "${#packages[@]}" ]; then
        # A host rebooted in the middle of an earlier run may have left dpkg half done.
        dpkg --configure -a >/dev/null 2>&1 || true
        apt-get update -qq || fail "apt-get update failed; check the host's package sources"
        apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null || fail "installing ${packages[*]} failed"
      fi
      ;;
    *) dnf install -y -q "${packages[@]}" >/dev/null || fail "installing ${packages[*]} failed" ;;
  esac
  # Enabled and started without waiting: its start can stall for systemd's whole start
  # timeout on some hosts, and Longhorn only needs it running later, not now.
  if systemctl enable --quiet iscsid 2>/dev/null; then
    systemctl start --no-block iscsid
  else
    systemctl enable --quiet iscsid.socket 2>/dev/null || true
  fi
  mark_done longhorn-packages "${packages[*]}"
  result longhorn-packages applied
fi

# --- host hardening: key-only SSH ------------------------------------------------
# sshd keeps the first value it reads for a keyword, and the Include at the top of Debian's
# and Ubuntu's sshd_config reads sshd_config.d in name order: a drop-in named 00- comes before
# the images' own (Hetzner's cloud-init writes 50-cloud-init.conf with PasswordAuthentication
# yes). Whatever the files say, the step passes only when `sshd -T` shows the settings in force.
sshd_dropin=/etc/ssh/sshd_config.d/00-hk3s.conf
sshd_earlier_dropin=/etc/ssh/sshd_config.d/90-hk3s.conf # read last, so it lost to earlier files
sshd_text="# Managed by hk3s: keys only. Named 00- so that sshd reads it first (the first value wins).
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password"
# sshd -T alone shows the settings outside every Match block; a `Match User`/`Address` block
# can turn passwords back on for one connection. So the settings are read as sshd applies
# them (-C) to the program's own connection and to one from outside, for root and every
# account with a login shell.
sshd_outside_address=198.51.100.1 # TEST-NET-2: no real peer, matches only catch-all blocks
sshd_problems_for() {
  local effective
  effective=$(sshd -T "$@" 2>&1) || {
    printf 'sshd -T %s failed: %s; ' "$*" "$(printf '%s' "$effective" | tail -n 1)"
    return
  }
  printf '%s\n' "$effective" | awk -v where="$*" '
    function say(setting, value) { printf "%s%s is %s; ", (where == "" ? "" : "(" where ") "), setting, value }
    $1 == "passwordauthentication" && $2 != "no" { say("PasswordAuthentication", $2) }
    $1 == "kbdinteractiveauthentication" && $2 != "no" { say("KbdInteractiveAuthentication", $2) }
    $1 == "permitrootlogin" && $2 != "without-password" && $2 != "prohibit-password" && $2 != "no" {
      say("PermitRootLogin", $2)
    }'
}
sshd_effective_problems() {
  local problems client_address local_address local_port user users address
  problems=$(sshd_problems_for)
  if [ -n "$problems" ]; then
    printf '%s' "$problems"
    return
  fi
  # SSH_CONNECTION: client address, client port, local address, local port of this login.
  read -r client_address _ local_address local_port <<<"${SSH_CONNECTION:-127.0.0.1 0 127.0.0.1 22}"
  # The outside connection's address must not be the program's own (or the host's).
  for address in "$sshd_outside_address" 203.0.113.1 192.0.2.1; do
    if [ "$address" != "$client_address" ] && [ "$address" != "$local_address" ]; then
      sshd_outside_address=$address
      break
    fi
  done
  users=$({
    printf 'root\n%s\n' "${SUDO_USER:-$(id -un)}"
    awk -F: '$7 !~ /(nologin|false|sync|shutdown|halt)$/ && $7 != "" { print $1 }' /etc/passwd
  } | sort -u)
  for user in $users; do
    for address in "$client_address" "$sshd_outside_address"; do
      sshd_problems_for -C "user=$user,host=$address,addr=$address,laddr=$local_address,lport=$local_port"
    done
  done
}
hardening_changed=no
if [ -f "$sshd_earlier_dropin" ]; then
  rm -f "$sshd_earlier_dropin"
  hardening_changed=yes
fi
mkdir -p /etc/ssh/sshd_config.d
if [ ! -f "$sshd_dropin" ] || [ "$(cat "$sshd_dropin")" != "$sshd_text" ]; then
  printf '%s\n' "$sshd_text" >"$sshd_dropin"
  hardening_changed=yes
fi
if [ "$hardening_changed" = yes ]; then
  if ! sshd -t 2>/dev/null; then
    rm -f "$sshd_dropin"
    fail "sshd rejected the hardening drop-in $sshd_dropin; the host's sshd_config needs a look"
  fi
  # sshd re-executes itself on reload and refuses connections until it listens again: wait for
  # its new listening socket, so the next login (the server's k3s install) is not refused.
  # awk reads to the end: an early exit would kill sshd -T with SIGPIPE, failing the pipeline.
  sshd_port=$(sshd -T 2>/dev/null | awk '$1 == "port" && !found { print $2; found = 1 }')
  # No listener for a moment is the point of the wait: never an error here.
  sshd_listeners() { { ss -Htlne "sport = :${sshd_port:-22}" 2>/dev/null || true; } | { grep -o 'ino:[0-9]*' || true; } | sort | tr '\n' ' '; }
  listening_before=$(sshd_listeners)
  systemctl reload ssh 2>/dev/null || systemctl reload sshd 2>/dev/null ||
    fail "sshd did not reload after the hardening drop-in was written; run systemctl reload ssh and look at its log"
  # A socket-activated sshd (systemd's listener) never changes it: the wait then ends after 10 s.
  for _ in $(seq 100); do
    listening_now=$(sshd_listeners)
    if [ -n "$listening_now" ] && [ "$listening_now" != "$listening_before" ]; then break; fi
    sleep 0.1
  done
fi
problems=$(sshd_effective_problems)
if [ -n "$problems" ]; then
  case "$problems" in
    "(-C "*)
      fail "SSH hardening is not in force for some connections: sshd -T -C says ${problems%; }; a Match block (in /etc/ssh/sshd_config or a file it includes) turns it back on for them: remove or change it, then run again"
      ;;
  esac
  fail "SSH hardening is not in force: sshd -T says ${problems% } although $sshd_dropin says otherwise; a setting read before it wins (in /etc/ssh/sshd_config above its Include of sshd_config.d, or no such Include): remove or change it, then run again"
fi
if [ "$hardening_changed" = yes ]; then
  result host-hardening applied
else
  result host-hardening skipped
fi
