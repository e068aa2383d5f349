#!/usr/bin/env bash
# The lab's one set-up command: installs the Debian packages it needs, then
# builds or reuses (cached outside the repository, in $HK3S_LAB_CACHE):
#   - kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kine (lab/build/kube.sh)
#   - the Pulumi CLI and its Python language host (lab/build/pulumi.sh)
#   - the k3s stand-in (lab/build/k3s_standin.sh)
#   - the real Kubernetes provider plugin, pulumi-resource-kubernetes, installed into the lab's
#     plugin cache for the pulumi-kubernetes version requirements.txt pins (lab/build/k8s_provider.sh;
#     about 7 min cold, skipped while its stamp matches)
#   - the slow disk, a FUSE filesystem whose syncs wait (lab/build/slow_disk.sh)
#   - the pod runtime of pod-capable hosts: runc, containerd, CNI plugins, crictl, the kubelet and the
#     pause and test images, and the stand-in for Longhorn's CSI node plugin (lab/build/pod_runtime.sh;
#     the kubelet and the plugin built in kube.sh's tools module, at its Kubernetes release)
#   - the Debian base tree lab hosts boot from (lab.hosts.base_tree.ensure_base)
# Prints each step and its time; `--timings FILE` also writes them as JSON.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
export HK3S_LAB_CACHE=${HK3S_LAB_CACHE:-/var/cache/hk3s-lab}
timings_file=
if [ "${1:-}" = "--timings" ]; then
  timings_file=${2:?--timings needs a file}
fi

declare -a timing_lines=()
step() {
  local name=$1
  shift
  local started
  started=$(date +%s.%N)
  echo "== lab set-up: $name"
  "$@"
  local seconds
  seconds=$(printf "%.3f" "$(echo "$(date +%s.%N) - $started" | bc)")
  printf '== lab set-up: %s done in %.1f s\n' "$name" "$seconds"
  timing_lines+=("\"$name\": $seconds")
}

step "debian packages" bash scripts/setup_system.sh --lab
# Every booted host's systemd takes inotify instances from one machine-wide budget
# (default 128): about 15 hosts exhaust it. Raise it for the lab's host counts.
if [ "$(sysctl -n fs.inotify.max_user_instances)" -lt 8192 ]; then
  sysctl -q -w fs.inotify.max_user_instances=8192
fi
step "python environment" bash scripts/setup_python.sh requirements-dev.txt
step "kubernetes control plane" bash lab/build/kube.sh
step "pulumi cli" bash lab/build/pulumi.sh
step "k3s stand-in" bash lab/build/k3s_standin.sh
step "kubernetes provider plugin" bash lab/build/k8s_provider.sh
step "slow disk" bash lab/build/slow_disk.sh
step "pod runtime" bash lab/build/pod_runtime.sh
step "host base tree" venv/bin/python -c '
import os, pathlib
from lab.hosts.base_tree import ensure_base
print(ensure_base(pathlib.Path(os.environ["HK3S_LAB_CACHE"])))
'

if [ -n "$timings_file" ]; then
  {
    printf '{'
    (IFS=,; printf '%s' "${timing_lines[*]}")
    printf '}\n'
  } >"$timings_file"
fi
echo "== lab set-up complete; binaries in $HK3S_LAB_CACHE/bin"
