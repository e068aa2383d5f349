#!/usr/bin/env bash
# Reads what preflight and network-mode selection need to know about a host.
# Changes nothing. Prints one "fact <name> <value>" line per fact.
set -euo pipefail

fact() { printf 'fact %s %s\n' "$1" "$2"; }

if [ -r /etc/os-release ]; then
  # shellcheck disable=SC1091
  . /etc/os-release
  fact os_id "${ID:-unknown}"
  fact os_version_id "${VERSION_ID:-unknown}"
  fact os_pretty_name "${PRETTY_NAME:-unknown}"
else
  fact os_id unknown
  fact os_version_id unknown
  fact os_pretty_name unknown
fi
fact kernel "$(uname -r)"
fact architecture "$(uname -m)"
fact cpus "$(getconf _NPROCESSORS_ONLN)"
fact memory_mb "$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)"
fact swap_mb "$(awk '/^SwapTotal:/ {print int($2 / 1024)}' /proc/meminfo)"
if [ -d /run/systemd/system ]; then fact systemd yes; else fact systemd no; fi

# WireGuard: loaded, or loadable by modprobe.
if [ -d /sys/module/wireguard ]; then
  fact wireguard loaded
elif command -v modprobe >/dev/null && modprobe -n -q wireguard 2>/dev/null; then
  fact wireguard loadable
else
  fact wireguard missing
fi

# IPv4 addresses per interface, and the routing table, as "ip" prints them.
ip -4 -o addr show scope global | while read -r _ iface _ cidr _; do
  fact ipv4_address "$iface $cidr"
done
ip -4 route show table main | while read -r line; do
  fact ipv4_route "$line"
done

# State left by an earlier Kubernetes install makes a join loop on a CA mismatch.
for path in /etc/rancher/k3s /var/lib/rancher/k3s/agent /var/lib/rancher/k3s/server \
  /etc/kubernetes/kubelet.conf /var/lib/kubelet/pki /etc/cni/net.d; do
  # k3s's air-gap images folder alone (agent/images, placed before the install as k3s's
  # air-gap instructions say) is no earlier install.
  if [ "$path" = /var/lib/rancher/k3s/agent ] && [ "$(ls -A "$path" 2>/dev/null)" = images ]; then continue; fi
  if [ -e "$path" ]; then fact kubernetes_state "$path"; fi
done
# Another container engine running beside k3s (Docker's dockerd, a containerd of the host's own,
# CRI-O, podman's conmon): k3s's own containerd runs from k3s's data dir and is not one.
for pid in $(pgrep -x 'dockerd|containerd|crio|conmon' 2>/dev/null || true); do
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
  case "$exe" in /var/lib/rancher/k3s/data/*) continue ;; esac
  echo "$exe"
done | sort -u | while read -r exe; do
  fact container_engine "$exe"
done
fact complete yes
