#!/usr/bin/env bash
# Waits until the k3s server's API is ready, then prints its version and the
# hash agents pin: SHA-256 of the bytes /cacerts serves.
#   k3s_server_ready.sh DEADLINE_SECONDS
set -euo pipefail

deadline=$1
bin=/usr/local/bin/k3s
end=$((SECONDS + deadline))
until "$bin" kubectl get --raw /readyz >/dev/null 2>&1; do
  if [ "$SECONDS" -ge "$end" ]; then
    printf 'error the k3s API did not become ready within %ss; last log lines:\n' "$deadline" >&2
    journalctl -u k3s --no-pager -n 15 -o cat >&2 || true
    exit 1
  fi
  sleep 1
done
printf 'result version %s\n' "$("$bin" --version | awk 'NR == 1 {print $3}')"
printf 'result ca_hash %s\n' "$(curl -fsSk https://127.0.0.1:6443/cacerts | sha256sum | cut -d' ' -f1)"
