#!/usr/bin/env bash
# The lab's one set-up command: installs the Debian packages it needs, then
# builds or reuses (cached outside the repository, in $HK3S_LAB_CACHE):
#   - kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kine (lab/build/kube.sh)
#   - the Pulumi CLI and its Python language host (lab/build/pulumi.sh)
#   - the k3s stand-in (lab/build/k3s_standin.sh)
#   - the real Kubernetes provider plugin, pulumi-resource-kubernetes, installed into the lab's
#     plugin cache for the pulumi-kubernetes version requirements.txt pins (lab/build/k8s_provider.sh;
#     about 3 min cold on 2 cores, skipped while its stamp matches)
#   - the slow disk, a FUSE filesystem whose syncs wait (lab/build/slow_disk.sh)
#   - the pod runtime of pod-capable hosts: runc, containerd, CNI plugins, crictl, the kubelet and the
#     pause and test images, and the stand-in for Longhorn's CSI node plugin (lab/build/pod_runtime.sh;
#     the kubelet and the plugin built in kube.sh's tools module, at its Kubernetes release)
#   - the Debian base tree lab hosts boot from (lab.hosts.base_tree.ensure_base)
#   - a real S3 server, versitygw, for stacks whose state is kept in a bucket (lab/build/versitygw.sh;
#     87 CPU-seconds cold on 2 cores, 141 s wall at nice 19 beside other builds)
#   - an hcloud provider plugin, pulumi-resource-hcloud, bridged from Hetzner's Terraform provider and
#     installed into the lab's plugin cache for the pulumi-hcloud version requirements.txt pins
#     (lab/build/hcloud_provider.sh; about 200 CPU-seconds cold beside the other builds, 256 from an
#     empty Go build cache: docs/lab.md; skipped while its stamp matches)
# Prints each step and its time; `--timings FILE` also writes them as JSON.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
export HK3S_LAB_CACHE=${HK3S_LAB_CACHE:-/var/cache/hk3s-lab}
timings_file=
if [ "${1:-}" = "--timings" ]; then
  timings_file=${2:?--timings needs a file}
fi

# Each step's time goes to a file, one "name": seconds line per step, so that the
# chains run in the background (below) report theirs too.
timing_dir=$(mktemp -d)
trap 'rm -rf "$timing_dir"' EXIT
step() {
  local name=$1
  shift
  local started
  started=$(date +%s.%N)
  echo "== lab set-up: $name"
  # Checked here, not left to set -e: a step run as `step ... || ...` would go on past a failure.
  local rc=0
  # What the step starts is its own in the CPU profile (scripts/test.sh, lab/cpu_profile.py).
  HK3S_CPU_ACCOUNT="setup:$name" "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "== lab set-up: $name FAILED (exit $rc)"
    return "$rc"
  fi
  local seconds
  seconds=$(printf "%.3f" "$(echo "$(date +%s.%N) - $started" | bc)")
  printf '== lab set-up: %s done in %.1f s\n' "$name" "$seconds"
  printf '"%s": %s\n' "$name" "$seconds" >>"$timing_dir/${chain:-main}"
}

step "debian packages" bash scripts/setup_system.sh --lab
# Every booted host's systemd takes inotify instances from one machine-wide budget
# (default 128): about 15 hosts exhaust it. Raise it for the lab's host counts.
if [ "$(sysctl -n fs.inotify.max_user_instances)" -lt 8192 ]; then
  sysctl -q -w fs.inotify.max_user_instances=8192
fi
step "python environment" bash scripts/setup_python.sh requirements-dev.txt

# Three chains run side by side, each in the order its steps need: the control plane, then
# the k3s stand-in and the pod runtime's kubelet (the same Kubernetes release, so they reuse
# its compiled packages); the Pulumi CLI, then the Kubernetes provider plugin (the same
# Pulumi SDK); the host base tree, which waits on the Debian mirror and the disk. Builds
# that share packages stay in one chain: two compiling one package at once would each do
# the work. The gain is small (cold on 2 cores: 1646 s; one after another 1723 s, measured
# on another day), as one Go build already keeps both cores busy but for its links and its
# single big packages. A background chain's output goes to its log, printed whole at its end.
run_chain() {
  local chain=$1
  shift
  ( "$@" ) >"$timing_dir/$chain.log" 2>&1
}
main_chain() {
  step "kubernetes control plane" bash lab/build/kube.sh &&
    step "k3s stand-in" bash lab/build/k3s_standin.sh &&
    step "slow disk" bash lab/build/slow_disk.sh &&
    step "pod runtime" bash lab/build/pod_runtime.sh
}
pulumi_chain() {
  step "pulumi cli" bash lab/build/pulumi.sh &&
    step "kubernetes provider plugin" bash lab/build/k8s_provider.sh
}
base_tree_chain() {
  step "host base tree" venv/bin/python -c '
import os, pathlib
from lab.hosts.base_tree import ensure_base
print(ensure_base(pathlib.Path(os.environ["HK3S_LAB_CACHE"])))
' &&
    # Here, not beside Pulumi: it shares no package versions with the other Go builds, and
    # this chain otherwise waits on the mirror and the disk, leaving a core free.
    step "s3 server (versitygw)" bash lab/build/versitygw.sh &&
    # Here too: its Pulumi modules are the bridge's (pulumi/pkg/v3 v3.218.0), not the CLI's, so
    # it shares almost no compiled package with the Pulumi chain; it waits for the CLI only
    # to install the plugin.
    step "hcloud provider plugin" bash lab/build/hcloud_provider.sh
}
chain=pulumi run_chain pulumi pulumi_chain &
pulumi_pid=$!
chain=base run_chain base base_tree_chain &
base_pid=$!

failed=()
main_chain || failed+=("the main chain")
for job in pulumi:$pulumi_pid base:$base_pid; do
  name=${job%%:*}
  if ! wait "${job#*:}"; then
    failed+=("the $name chain")
  fi
  echo "== lab set-up: the $name chain's output"
  cat "$timing_dir/$name.log"
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "== lab set-up FAILED: ${failed[*]} (see its output above)" >&2
  exit 1
fi

if [ -n "$timings_file" ]; then
  {
    printf '{'
    cat "$timing_dir"/main "$timing_dir"/pulumi "$timing_dir"/base | paste -sd, -
    printf '}\n'
  } >"$timings_file"
fi
echo "== lab set-up complete; binaries in $HK3S_LAB_CACHE/bin"
