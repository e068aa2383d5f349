#!/usr/bin/env bash
# Wipes k3s and what the program installed from a node, for a stack's teardown:
#   k3s_wipe.sh            wipe this host
#   k3s_wipe.sh --by-hand  print what a wipe does, as one "result by_hand" line, and change
#                          nothing (what a person runs on a host the program cannot reach)
# Idempotent: a wipe interrupted anywhere and run again finishes; on a clean host it
# changes nothing. Prints "result <name> <value>" lines.
#
# The program installs k3s itself (no k3s-install.sh, so no k3s-uninstall.sh on the host):
# this does what that uninstall does, in its order. Stopping the k3s unit leaves the
# containers running (KillMode=process), so their shims are killed before the mounts and
# folders under them go. The host firewall's rules are removed by their own resource
# (HostFirewall), which runs after this; its state under /var/lib/hk3s/firewall stays for it.
# The SSH hardening drop-in stays: removing it would weaken the host's login.
set -uo pipefail

result() { printf 'result %s %s\n' "$1" "$2"; }

# The files a wipe removes: k3s's data and config, its units, and the program's files on the host.
WIPED_PATHS=(
  /etc/systemd/system/k3s.service /etc/systemd/system/k3s-agent.service
  /etc/systemd/system/k3s.service.env /etc/systemd/system/k3s-agent.service.env
  /etc/systemd/system/k3s.service.d /etc/systemd/system/k3s-agent.service.d
  /etc/rancher/k3s /etc/rancher/node /var/lib/rancher/k3s /var/lib/kubelet /run/k3s /run/flannel
  /var/lib/cni /etc/cni/net.d/10-flannel.conflist
  /usr/local/bin/k3s.hk3s-upload /usr/local/bin/k3s.hk3s-upload.gz /usr/local/bin/k3s-killall.sh
  /etc/modules-load.d/hk3s.conf /etc/sysctl.d/90-hk3s.conf /var/lib/hk3s/journal
)
# Removed only where they point at k3s: an operator's own kubectl stays.
K3S_LINKS=(/usr/local/bin/kubectl /usr/local/bin/crictl /usr/local/bin/ctr)

# k3s's bundled tools, after the host's own, as k3s-killall.sh finds them (install.sh
# create_killall: every $K3S_DATA_DIR/data/*/bin and its aux on the PATH). On a host without
# iptables tools k3s made its rules with the iptables it extracted into data/<hash>/bin/aux (k3s
# puts that folder at the end of its own PATH), so only that copy can remove them; it goes with
# /var/lib/rancher/k3s, which is why the rules are removed, and checked, before the files.
for bundled in /var/lib/rancher/k3s/data/*/bin/; do
  [ -d "$bundled" ] && PATH="$PATH:$bundled:${bundled}aux"
done
export PATH

if [ "${1:-}" = --by-hand ]; then
  result by_hand "systemctl disable --now k3s k3s-agent; kill k3s's containerd-shim processes (those under /var/lib/rancher/k3s/data; another container engine's stay); remove the iptables and ip6tables chains KUBE-*, CNI-*, FLANNEL-* and the rules that jump to them or carry a \"flanneld\" comment (on a host without iptables tools, with k3s's own copy: PATH=\$PATH:\$(echo /var/lib/rancher/k3s/data/*/bin/aux | tr ' ' :)); nft delete table ip kube-proxy; nft delete table ip6 kube-proxy; then rm -rf ${WIPED_PATHS[*]} /usr/local/bin/k3s (and ${K3S_LINKS[*]} where they link to it)"
  exit 0
fi

# --- k3s units stopped, disabled, removed -----------------------------------
units=""
for unit_file in /etc/systemd/system/k3s*.service; do
  [ -e "$unit_file" ] || continue
  unit=$(basename "$unit_file")
  units="$units ${unit%.service}"
  systemctl disable --now "$unit" >/dev/null 2>&1 || true
done
result units "${units# }"
[ -x /usr/local/bin/k3s-killall.sh ] && /usr/local/bin/k3s-killall.sh >/dev/null 2>&1

# --- every k3s container: its shim and the processes under it ----------------
# k3s's shims only, as k3s's own k3s-killall.sh finds them (install.sh, create_killall: getshims
# greps `ps -e -o pid= -o args=` for "$K3S_DATA_DIR/data/[^/]*/bin/containerd-shim"): another
# container engine on the host (Docker's, the host's own containerd) keeps its containers.
K3S_SHIM_PATTERN='/var/lib/rancher/k3s/data/[^/]*/bin/containerd-shim'
descendants() {
  local pid child
  for pid in "$@"; do
    echo "$pid"
    for child in $(ps -e -o ppid= -o pid= | awk -v p="$pid" '$1 == p {print $2}'); do
      descendants "$child"
    done
  done
}
shims=$(ps -e -o pid= -o args= | awk -v re="$K3S_SHIM_PATTERN" '$0 ~ re {print $1}')
if [ -n "$shims" ]; then
  # shellcheck disable=SC2046,SC2086  # one PID per word
  kill -9 $(descendants $shims) 2>/dev/null || true
fi
result shims_killed "$(echo "$shims" | wc -w)"

# --- mounts under k3s's and the kubelet's folders, deepest first -------------
mounted=$(awk '{print $2}' /proc/self/mounts |
  grep -E '^(/run/k3s|/var/lib/rancher/k3s|/var/lib/kubelet|/run/netns/cni-)' | sort -r)
for path in $mounted; do
  umount -l "$path" 2>/dev/null || true
done
result unmounted "$(echo "$mounted" | wc -w)"

# --- the pod network's interfaces --------------------------------------------
for iface in cni0 flannel.1 flannel-v6.1 flannel-wg flannel-wg-v6 kube-ipvs0; do
  ip link delete "$iface" 2>/dev/null || true
done
for netns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ {print $1}'); do
  ip netns delete "$netns" 2>/dev/null || true
done

# --- the pod network's and kube-proxy's packet filter rules ------------------
# As k3s-killall.sh ends (install.sh create_killall: every iptables and ip6tables rule and chain
# of KUBE-, CNI- and flannel), and the tables kube-proxy's nftables mode makes (ip and ip6
# kube-proxy, its documented clean-up). The rules are matched by their chains (KUBE-*, CNI-*,
# FLANNEL-*) and flannel's own comments ("flanneld ..."), not by any mention of "flannel": the
# program's host firewall trusts the flannel interfaces by name in its own chains, which its own
# resource (HostFirewall) removes after this. Removed with `-D`/`-F`/`-X` through
# `iptables-restore --noflush`, one table at a time, so every other rule stays as it is.
KUBE_CHAIN_RE='^(KUBE-|CNI-|FLANNEL-)'
xtables_rules_removed=0
clean_xtables() {  # $1: iptables or ip6tables (legacy and nft variants: whichever are there)
  local save="$1-save" restore="$1-restore" table dump chains script
  command -v "$save" >/dev/null 2>&1 && command -v "$restore" >/dev/null 2>&1 || return 0
  for table in filter nat mangle raw; do
    dump=$("$save" -t "$table" 2>/dev/null) || continue
    chains=$(printf '%s\n' "$dump" | awk -v re="$KUBE_CHAIN_RE" '/^:/ {c = substr($1, 2); if (c ~ re) print c}')
    # Rules in the other chains that jump to those chains or carry flannel's comments.
    script=$(printf '%s\n' "$dump" | awk -v re="$KUBE_CHAIN_RE" '
      /^-A / { if ($2 ~ re) next; if ($0 ~ /-j (KUBE-|CNI-|FLANNEL-)|-g (KUBE-|CNI-|FLANNEL-)|"flanneld /) { sub(/^-A /, "-D "); print } }')
    [ -n "$chains$script" ] || continue
    script="*$table"$'\n'"$script"
    for chain in $chains; do script="$script"$'\n'"-F $chain"; done
    for chain in $chains; do script="$script"$'\n'"-X $chain"; done
    script="$script"$'\n'"COMMIT"
    if printf '%s\n' "$script" | "$restore" --noflush 2>/dev/null; then
      xtables_rules_removed=$((xtables_rules_removed + $(printf '%s\n' "$script" | grep -c '^-[DX] ')))
    fi
  done
}
for tool in iptables ip6tables iptables-legacy ip6tables-legacy iptables-nft ip6tables-nft; do clean_xtables "$tool"; done
nft_tables_removed=""
if command -v nft >/dev/null 2>&1; then
  for family in ip ip6; do
    if nft list table "$family" kube-proxy >/dev/null 2>&1 && nft delete table "$family" kube-proxy 2>/dev/null; then
      nft_tables_removed="$nft_tables_removed $family/kube-proxy"
    fi
  done
fi
result packet_filter "rules and chains removed: $xtables_rules_removed; nftables tables removed:${nft_tables_removed:- none}"

# k3s's rules still there, by the iptables tools (the host's, else k3s's bundled copy) and, where
# nft is, by the ruleset itself (iptables-nft's chains are nftables chains of the same name), so
# that a host whose tools are all gone does not pass unchecked. Checked before the files go: a
# wipe that stops here keeps k3s's bundled tools for the next run. Each listing is read whole
# before it is searched: under pipefail, `lister | grep -q` fails when grep stops at the first
# match while the lister still writes (SIGPIPE), which a long ruleset makes certain, and the
# leftovers would pass as none.
rules_left() {
  local tool found="" listing
  for tool in iptables ip6tables; do
    if command -v "$tool-save" >/dev/null 2>&1; then
      listing=$("$tool-save" 2>/dev/null || true)
      grep -Eq '^:(KUBE-|CNI-|FLANNEL-)' <<<"$listing" && found="$found $tool-chains"
    fi
  done
  if command -v nft >/dev/null 2>&1; then
    for family in ip ip6; do
      nft list table "$family" kube-proxy >/dev/null 2>&1 && found="$found nft-$family-kube-proxy"
    done
    listing=$(nft list ruleset 2>/dev/null || true)
    if grep -Eq '^[[:space:]]*chain (KUBE-|CNI-|FLANNEL-)' <<<"$listing"; then
      case "$found" in *-chains*) ;; *) found="$found nft-chains" ;; esac
    fi
  fi
  echo "${found# }"
}
left_rules=$(rules_left)
if [ -n "$left_rules" ]; then
  result left "$left_rules"
  printf 'error k3s packet filter rules still on the host after the wipe: %s (no iptables tool of the host or of k3s could remove them: install iptables and run the wipe again)\n' "$left_rules" >&2
  exit 1
fi

# --- files: k3s's data and config, the binary and its links, the program's ---
removed=""
for path in "${WIPED_PATHS[@]}"; do
  if [ -e "$path" ]; then rm -rf "$path" && removed="$removed $path"; fi
done
for link in "${K3S_LINKS[@]}"; do
  if [ -L "$link" ] && [ "$(readlink "$link")" = /usr/local/bin/k3s ]; then rm -f "$link" && removed="$removed $link"; fi
done
if [ -e /usr/local/bin/k3s ]; then rm -f /usr/local/bin/k3s && removed="$removed /usr/local/bin/k3s"; fi
systemctl daemon-reload >/dev/null 2>&1 || true
result removed "${removed# }"

# --- nothing of k3s left ------------------------------------------------------
left=""
pgrep -x k3s-server >/dev/null 2>&1 && left="$left k3s-server"
pgrep -f '^/usr/local/bin/k3s ' >/dev/null 2>&1 && left="$left k3s"
pgrep -f "$K3S_SHIM_PATTERN" >/dev/null 2>&1 && left="$left containerd-shim"
[ -e /var/lib/rancher/k3s ] && left="$left /var/lib/rancher/k3s"
left_rules=$(rules_left)
[ -n "$left_rules" ] && left="$left $left_rules"
result left "${left# }"
if [ -n "$left" ]; then
  printf 'error still on the host after the wipe:%s\n' "$left" >&2
  exit 1
fi
