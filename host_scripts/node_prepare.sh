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
sshd_dropin=/etc/ssh/sshd_config.d/90-hk3s.conf
sshd_text="# Managed by hk3s: keys only.
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password"
if [ -d /etc/ssh/sshd_config.d ] && { [ ! -f "$sshd_dropin" ] || [ "$(cat "$sshd_dropin")" != "$sshd_text" ]; }; then
  printf '%s\n' "$sshd_text" >"$sshd_dropin"
  if sshd -t 2>/dev/null; then
    systemctl reload ssh 2>/dev/null || systemctl reload sshd 2>/dev/null || true
    result host-hardening applied
  else
    rm -f "$sshd_dropin"
    fail "sshd rejected the hardening drop-in; the host's sshd_config needs a look"
  fi
else
  result host-hardening skipped
fi
