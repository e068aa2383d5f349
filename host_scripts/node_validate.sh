#!/usr/bin/env bash
# Checks a joined node while it is still tainted: DNS, the server's API from the
# node, Longhorn's prerequisites, the cluster registry. Prints one
# "result <check> ok|failed: <why>" line per check; changes nothing.
#   node_validate.sh SERVER_HOST REGISTRY        (REGISTRY is host[:port] or -)
set -euo pipefail

server=$1
registry=$2
status=0
result() { printf 'result %s %s\n' "$1" "$2"; }
failed() {
  result "$1" "failed: $2"
  status=1
}

# DNS: the resolver answers for a name the node needs (the registry, else its package source).
name=
if [ "$registry" != "-" ]; then
  name=${registry%%:*}
else
  name=$(grep -rhoE '^(deb|URIs:)[^#]*https?://[^/ ]+' /etc/apt/sources.list /etc/apt/sources.list.d 2>/dev/null |
    sed -E 's#.*https?://([^/ ]+).*#\1#' | head -n1 || true)
fi
if [ -z "$name" ]; then
  result dns "ok: no name to resolve (no registry, no package source)"
elif getent ahostsv4 "$name" >/dev/null; then
  result dns "ok: $name resolves"
else
  failed dns "$name does not resolve: fix /etc/resolv.conf or the resolver the node uses"
fi

# The server's API from the node (the address the agent uses).
if curl -fsSk --max-time 10 -o /dev/null "https://$server:6443/cacerts"; then
  result api-from-node "ok: https://$server:6443 answers"
else
  failed api-from-node "https://$server:6443 does not answer from this node: open 6443/tcp to the server"
fi

# Longhorn's prerequisites.
missing=()
command -v iscsiadm >/dev/null || missing+=(iscsiadm)
[ -x /sbin/mount.nfs ] || [ -x /usr/sbin/mount.nfs ] || missing+=(mount.nfs)
if [ "${#missing[@]}" -eq 0 ]; then
  result longhorn-prerequisites "ok: iscsiadm and mount.nfs present"
else
  failed longhorn-prerequisites "missing ${missing[*]}: install open-iscsi and an NFS client"
fi

# The cluster registry, when one is configured: any HTTP answer from /v2/ means reachable.
if [ "$registry" != "-" ]; then
  if curl -sk --max-time 10 -o /dev/null -w '%{http_code}' "https://$registry/v2/" | grep -qE '^[1-5][0-9][0-9]$'; then
    result registry "ok: https://$registry/v2/ answers"
  else
    failed registry "https://$registry/v2/ does not answer from this node: open the route or fix hk3s:cluster.registry"
  fi
fi
exit "$status"
