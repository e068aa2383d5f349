#!/usr/bin/env bash
# Lifts a fence on the host: removes the drop-in that held the k3s agent down (k3s_fence.sh
# wrote it) and starts the agent. Idempotent. Prints "result" lines:
#   result drop_in <removed|absent>
#   result agent <the unit's state after the start>
set -euo pipefail

DROP_IN=/etc/systemd/system/k3s-agent.service.d/hk3s-fence.conf

if [ -e "$DROP_IN" ]; then
  rm -f "$DROP_IN"
  printf 'result drop_in removed\n'
else
  printf 'result drop_in absent\n'
fi
systemctl daemon-reload
systemctl start k3s-agent
printf 'result agent %s\n' "$(systemctl is-active k3s-agent)"
