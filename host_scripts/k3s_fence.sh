#!/usr/bin/env bash
# Stops a fenced worker's k3s agent and everything it ran, keeps the agent from starting
# again (even after a reboot), and checks that nothing of it is left. Prints "result" lines:
#   result drop_in <written|present>
#   result left <item>...   one word per thing still there (empty when none): process:<pid>:<name>
#                            for a process, mount:<path> for a mount
# Idempotent: run again after an interruption anywhere it finishes the same way; it removes
# no data (volumes, images and k3s's state stay for the worker's rejoin).
#
# The order matters: the drop-in first, so that nothing (systemd's Restart=, a reboot, a
# person) starts the agent again while its containers are being stopped; then the agent,
# whose stop leaves the containers running (KillMode=process); then the containers' shims
# and everything under them; then the pod mounts, which only come off once no process
# holds them.
set -uo pipefail

DROP_IN_DIR=/etc/systemd/system/k3s-agent.service.d
DROP_IN=$DROP_IN_DIR/hk3s-fence.conf

result() { printf 'result %s %s\n' "$1" "$2"; }

# --- the drop-in: the agent's start is skipped while this file exists --------
if [ -s "$DROP_IN" ]; then
  result drop_in present
else
  mkdir -p "$DROP_IN_DIR"
  cat >"$DROP_IN.part" <<EOF
# Written by hk3s when this worker was fenced: its workloads were started elsewhere, so its
# k3s agent must not start again (not even after a reboot) until the fence is lifted by a
# rejoin, which removes this file. The condition fails while the file exists.
[Unit]
ConditionPathExists=!$DROP_IN
EOF
  mv -f "$DROP_IN.part" "$DROP_IN"
  result drop_in written
fi
systemctl daemon-reload

# --- the agent, then every container -----------------------------------------
systemctl stop k3s-agent >/dev/null 2>&1 || true
# k3s's own clean-up where its install script left it (it stops the units, kills the shims,
# unmounts the pod mounts); the steps below do the same on hosts without it.
if [ -x /usr/local/bin/k3s-killall.sh ]; then
  /usr/local/bin/k3s-killall.sh >/dev/null 2>&1 || true
fi

K3S_SHIM_PATTERN='/var/lib/rancher/k3s/data/[^/]*/bin/containerd-shim'
k3s_shims() { ps -e -o pid= -o args= | awk -v re="$K3S_SHIM_PATTERN" '$0 ~ re {print $1}'; }

descendants() {
  local pid child
  for pid in "$@"; do
    echo "$pid"
    for child in $(ps -e -o ppid= -o pid= | awk -v p="$pid" '$1 == p {print $2}'); do
      descendants "$child"
    done
  done
}
# k3s's shims only, as k3s's own k3s-killall.sh finds them (install.sh, create_killall: getshims
# greps `ps -e -o pid= -o args=` for "$K3S_DATA_DIR/data/[^/]*/bin/containerd-shim"): the shims
# of another container engine on the host (Docker's, the host's own containerd) and their
# containers are none of k3s's and keep running.
shims=$(k3s_shims)
if [ -n "$shims" ]; then
  # shellcheck disable=SC2046,SC2086  # one PID per word
  kill -9 $(descendants $shims) 2>/dev/null || true
  sleep 1
fi

# --- the pod mounts, deepest first (a plain umount: one still held stays, and is named) ---
pod_mounts() {
  awk '$2 ~ /^(\/run\/k3s\/|\/var\/lib\/kubelet\/pods\/|\/var\/lib\/kubelet\/plugins\/|\/run\/netns\/cni-)/ ||
       $1 ~ /^\/dev\/longhorn\// {print $2}' /proc/self/mounts | sort -r
}
for path in $(pod_mounts); do
  umount "$path" 2>/dev/null || true
done

# --- what is left --------------------------------------------------------------
left=""
own_pid_ns=$(readlink /proc/1/ns/pid)
# Another container engine's processes are not k3s's and are left alone: its shims (a
# containerd-shim outside k3s's data dir, podman's conmon) and what runs under them.
foreign_parents=" $(ps -e -o pid= -o comm= -o args= |
  awk -v re="$K3S_SHIM_PATTERN" '($0 ~ /containerd-shim/ && $0 !~ re) || $2 == "conmon" {printf "%s ", $1}')"
under_foreign_engine() {
  local pid=$1 hops=0
  while [ "$pid" -gt 1 ] && [ "$hops" -lt 64 ]; do
    case "$foreign_parents" in *" $pid "*) return 0 ;; esac
    pid=$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ') || return 1
    [ -n "$pid" ] || return 1
    hops=$((hops + 1))
  done
  return 1
}
for proc in /proc/[0-9]*; do
  pid=${proc#/proc/}
  [ "$pid" = "$$" ] && continue
  args=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || continue
  [ -n "$args" ] || continue # a kernel thread
  name=$(cat "$proc/comm" 2>/dev/null) || continue
  under_foreign_engine "$pid" && continue
  why=""
  case "$args" in
  *containerd-shim*) why=shim ;; # not another engine's (above): k3s's, wherever it runs from
  *longhorn*) why=longhorn ;;
  esac
  [ "$name" = kubelet ] || [ "$name" = k3s-agent ] && why=agent
  # k3s's containerd runs from its data dir and serves /run/k3s/containerd; a host's own
  # containerd (Docker's) is neither and stays.
  if [ "$name" = containerd ]; then
    exe=$(readlink "$proc/exe" 2>/dev/null) || exe=""
    case "$exe $args" in
    /var/lib/rancher/k3s/data/* | */run/k3s/containerd*) why=agent ;;
    esac
  fi
  # A container's processes: in a pod's cgroup, or in a PID namespace of their own (and not
  # under another engine's shim: that engine's containers).
  grep -q kubepods "$proc/cgroup" 2>/dev/null && why=container
  pid_ns=$(readlink "$proc/ns/pid" 2>/dev/null) || continue # gone meanwhile
  [ "$pid_ns" != "$own_pid_ns" ] && why=container
  [ -n "$why" ] && left="$left process:$pid:${name// /_}"
done
for path in $(pod_mounts); do
  left="$left mount:$path"
done
if systemctl is-active --quiet k3s-agent; then
  left="$left unit:k3s-agent"
fi
result left "${left# }"
