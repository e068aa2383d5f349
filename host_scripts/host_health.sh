#!/usr/bin/env bash
# Read-only health facts of a node, for `status --check`:
#   host_health.sh
# Prints "result <name> <value>" lines; changes nothing on the host.
set -uo pipefail

result() { printf 'result %s %s\n' "$1" "$2"; }

# The k3s unit this program installed: k3s on the server, k3s-agent on a worker.
for unit in k3s k3s-agent; do
  if [ -f "/etc/systemd/system/$unit.service" ]; then
    result unit "$unit"
    result active "$(systemctl is-active "$unit" 2>/dev/null || true)"
    break
  fi
done

# The server's Secrets encrypted at rest: k3s writes this file when it starts with
# secrets-encryption (docs.k3s.io, "Secrets Encryption Config"); the config says it was asked.
if [ -f /etc/systemd/system/k3s.service ]; then
  if [ -f /var/lib/rancher/k3s/server/cred/encryption-config.json ] ||
    grep -qx 'secrets-encryption: true' /etc/rancher/k3s/config.yaml 2>/dev/null; then
    result secrets_encryption yes
  else
    result secrets_encryption no
  fi
  # The API server refuses Services with externalIPs (CVE-2020-8554) only with this plugin.
  if grep -q '^- enable-admission-plugins=.*DenyServiceExternalIPs' /etc/rancher/k3s/config.yaml 2>/dev/null; then
    result deny_service_external_ips yes
  else
    result deny_service_external_ips no
  fi
fi

# Free space where k3s keeps its data and images, and on the root file system.
for mount in / /var/lib/rancher; do
  [ -d "$mount" ] || continue
  free=$(df -P "$mount" 2>/dev/null | awk 'NR == 2 { used = $5; sub("%", "", used); print 100 - used }')
  [ -n "$free" ] && result "disk_free_percent:$mount" "$free"
done

# The clock: certificates and tokens are checked against it.
synced=$(timedatectl show -p NTPSynchronized --value 2>/dev/null || true)
result time_synced "${synced:-unknown}"

# The node's client certificate (k3s renews it when it starts close to its expiry).
cert=/var/lib/rancher/k3s/agent/client-kubelet.crt
if [ -r "$cert" ]; then
  end=$(openssl x509 -enddate -noout -in "$cert" 2>/dev/null | sed 's/^notAfter=//')
  if [ -n "$end" ]; then
    result cert_expires_epoch "$(date -d "$end" +%s)"
  fi
fi
result now_epoch "$(date +%s)"
