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

# The server's Secrets encrypted at rest, as k3s itself reports it (`k3s secrets-encrypt
# status`: Enabled, Disabled, or no configuration at all), never the config file's line alone: a
# server may have been asked for it and not have restarted since. k3s writes encryption-config.json
# at the first start with secrets-encryption, and the server's CA (its CN ends in @<unix time>) at
# its very first start: a config much younger than the CA means the server ran without encryption
# before, and Secrets stored then stay unencrypted until re-encrypted (stage reencrypt_finished).
if [ -f /etc/systemd/system/k3s.service ]; then
  tls=/var/lib/rancher/k3s/server
  status=$(/usr/local/bin/k3s secrets-encrypt status 2>/dev/null || true)
  case $status in
    *"Encryption Status: Enabled"*) result secrets_encryption yes ;;
    *"Encryption Status: Disabled"*) result secrets_encryption no ;;
    *) result secrets_encryption unknown ;;
  esac
  stage=$(printf '%s\n' "$status" | sed -n 's/^Current Rotation Stage: //p')
  [ -n "$stage" ] && result secrets_encryption_stage "$stage"
  began=$(stat -c %Y "$tls/cred/encryption-config.json" 2>/dev/null || true)
  [ -n "$began" ] && result secrets_encryption_began "$began"
  cluster=$(openssl x509 -subject -noout -in "$tls/tls/server-ca.crt" 2>/dev/null | sed -n 's/.*@\([0-9][0-9]*\).*/\1/p')
  [ -n "$cluster" ] && result cluster_began "$cluster"
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
# The server's own certificates (its API's serving certificate, the admin, controller-manager,
# scheduler and supervisor clients): k3s renews them only when it starts within 90 days of their
# end (k3s's deps.go), so a server that runs on, or restarts earlier, keeps them to their end.
# The one that ends first, and its file.
if [ -f /etc/systemd/system/k3s.service ]; then
  first_end='' first_file=''
  for name in serving-kube-apiserver client-admin client-controller client-scheduler client-supervisor \
    client-kube-apiserver client-auth-proxy; do
    file=/var/lib/rancher/k3s/server/tls/$name.crt
    [ -r "$file" ] || continue
    end=$(openssl x509 -enddate -noout -in "$file" 2>/dev/null | sed 's/^notAfter=//')
    [ -n "$end" ] || continue
    end=$(date -d "$end" +%s)
    if [ -z "$first_end" ] || [ "$end" -lt "$first_end" ]; then
      first_end=$end first_file=$name.crt
    fi
  done
  if [ -n "$first_end" ]; then
    result server_cert_expires_epoch "$first_end"
    result server_cert_file "$first_file"
  fi
fi
result now_epoch "$(date +%s)"
