#!/bin/sh
# k3s-killall.sh as k3s's install script (get.k3s.io, create_killall) writes it to
# /usr/local/bin: stops every k3s unit, kills every container shim (and so every
# container) of the bundled containerd, unmounts and removes the pod mounts and the
# CNI network namespaces, and deletes the pod network's interfaces.
# LAB ONLY copy: the lab installs it on pod-capable hosts (lab/pod_hosts.py), since the
# product installs k3s air-gapped without the install script. Same steps and order as
# upstream's, but for upstream's last two lines (iptables-save | grep -v KUBE- | grep -v CNI- |
# grep -iv flannel | iptables-restore, and the same for ip6tables): the stand-in's nodes make
# such chains (netrules.go), and the program's wipe, which must remove them itself on hosts
# without this script, is what the lab tests.
[ "$(id -u)" -eq 0 ] || exec sudo --preserve-env=K3S_DATA_DIR "$0" "$@"

K3S_DATA_DIR=${K3S_DATA_DIR:-/var/lib/rancher/k3s}

for bin in "$K3S_DATA_DIR"/data/*/bin/; do
  [ -d "$bin" ] && export PATH="$PATH:$bin:${bin}aux"
done

set -x

for service in /etc/systemd/system/k3s*.service; do
  [ -s "$service" ] && systemctl stop "$(basename "$service")"
done

for service in /etc/init.d/k3s*; do
  [ -x "$service" ] && "$service" stop
done

pschildren() {
  ps -e -o ppid= -o pid= | sed -e 's/^\s*//g; s/\s\s*/\t/g;' | grep -w "^$1" | cut -f2
}

pstree() {
  for pid in "$@"; do
    echo "$pid"
    for child in $(pschildren "$pid"); do
      pstree "$child"
    done
  done
}

killtree() {
  # shellcheck disable=SC2046  # one PID per word
  kill -9 $(
    { set +x; } 2>/dev/null
    pstree "$@"
    set -x
  ) 2>/dev/null
}

remove_interfaces() {
  # Delete network interface(s) that match 'master cni0'
  ip link show 2>/dev/null | grep 'master cni0' | while read -r _ iface _; do
    iface=${iface%%@*}
    [ -z "$iface" ] || ip link delete "$iface"
  done

  # Delete cni related interfaces
  ip link delete cni0
  ip link delete flannel.1
  ip link delete flannel-v6.1
  ip link delete kube-ipvs0
  ip link delete flannel-wg
  ip link delete flannel-wg-v6
}

getshims() {
  ps -e -o pid= -o args= | sed -e 's/^ *//; s/\s\s*/\t/;' | grep -w 'k3s/data/[^/]*/bin/containerd-shim' | cut -f1
}

# shellcheck disable=SC2046  # one PID per word
killtree $(
  { set +x; } 2>/dev/null
  getshims
  set -x
)

do_unmount_and_remove() {
  set +x
  # shellcheck disable=SC2016  # $0 is expanded by the inner sh
  while read -r _ path _; do
    case "$path" in $1*) echo "$path" ;; esac
  done </proc/self/mounts | sort -r | xargs -r -t -n 1 sh -c 'umount -f "$0" && rm -rf "$0"'
  set -x
}

do_unmount_and_remove '/run/k3s'
do_unmount_and_remove '/var/lib/kubelet/pods'
do_unmount_and_remove '/var/lib/kubelet/plugins'
do_unmount_and_remove '/run/netns/cni-'

# Remove CNI namespaces
ip netns show 2>/dev/null | grep cni- | xargs -r -t -n 1 ip netns delete

remove_interfaces

rm -rf /var/lib/cni/
