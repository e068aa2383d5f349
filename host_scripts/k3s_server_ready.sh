#!/usr/bin/env bash
# Waits until the k3s server's API is ready, then prints its version and the
# SHA-256 of the bytes /cacerts serves (the hash agents pin for a single-certificate
# CA; the program computes the pinned hash itself, k3s_install.k3s_ca_hash).
#   k3s_server_ready.sh DEADLINE_SECONDS [NODE NODE_IP]
# With NODE and NODE_IP (the recovery checks after a change of the server's
# configuration), also waits until the server's Node reports NODE_IP as its
# InternalIP. Only the k3s its unit's last start started counts (an old one still
# stopping after a `systemctl restart --no-block` does not). A k3s that restarts three
# times without becoming ready fails at once instead of at the deadline.
set -euo pipefail

deadline=$1
node=${2:-}
node_ip=${3:-}
bin=/usr/local/bin/k3s
end=$((SECONDS + deadline))
restarts() { systemctl show -p NRestarts --value k3s 2>/dev/null || echo 0; }
first_restarts=$(restarts)

give_up() {
  printf 'error %s; last log lines:\n' "$1" >&2
  journalctl -u k3s --no-pager -n 15 -o cat >&2 || true
  exit 1
}

# The k3s that answers must be the one the last start or restart started: the install restarts
# k3s with --no-block, and until systemd has stopped the old process that one still answers
# /readyz (and then goes away under whatever runs next). A restart is one job on the unit, done
# when the new process reports READY (Type=notify): no job and the unit active means the k3s
# running now is the one that job started.
started() {
  [ "$(systemctl is-active k3s 2>/dev/null || true)" = active ] || return 1
  [ -z "$(systemctl show -p Job --value k3s 2>/dev/null)" ]
}

ready() {
  started || return 1
  "$bin" kubectl get --raw /readyz >/dev/null 2>&1 || return 1
  [ -z "$node" ] && return 0
  have=$("$bin" kubectl get node "$node" -o 'jsonpath={.status.addresses[?(@.type=="InternalIP")].address}' 2>/dev/null) || return 1
  [ "$have" = "$node_ip" ]
}

until ready; do
  if [ "$SECONDS" -ge "$end" ]; then
    if [ -n "$node" ]; then
      give_up "the k3s API and node $node at $node_ip did not become ready within ${deadline}s"
    fi
    give_up "the k3s API did not become ready within ${deadline}s"
  fi
  now_restarts=$(restarts)
  if [ $((now_restarts - first_restarts)) -ge 3 ]; then
    give_up "k3s restarted $((now_restarts - first_restarts)) times without becoming ready"
  fi
  sleep 1
done
printf 'result version %s\n' "$("$bin" --version | awk 'NR == 1 {print $3}')"
printf 'result ca_hash %s\n' "$(curl -fsSk https://127.0.0.1:6443/cacerts | sha256sum | cut -d' ' -f1)"
