#!/usr/bin/env bash
# Stops a fenced worker's k3s agent and everything it ran, keeps the agent from starting
# again (even after a reboot), and checks that nothing of it is left. Prints "result" lines:
#   result drop_in <written|present>
#   result left <item>...   one word per thing still there (empty when none): process:<pid>:<name>
#                            for a process, mount:<path> for a mount
#   result unflushed <path>...  pod mounts taken off without a flush: their filesystem did not
#                            answer in time (empty when none)
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

# The fence runs this script under a deadline (node_operations/fence.py), so nothing here may wait
# on the host for ever. A filesystem whose device stopped answering (a Longhorn volume whose iSCSI
# target went with its instance manager, a FUSE or NFS server gone) makes a plain umount wait, in
# its lookup of the path or in its flush, until the device's own timeout or for ever.
KILLALL_SECONDS=30
PROBE_SECONDS=5    # one statfs of a mount: does its filesystem answer?
UNMOUNT_SECONDS=10 # one plain unmount, its flush included
FORCED_SECONDS=5   # one unmount without a flush (forced, then detached)
UNMOUNT_BUDGET=60  # every unmount together

# Runs "$@" in the background for at most $1 seconds: 0 when it succeeded, 1 when it failed, 2 when
# it did not end in time. Then it is killed and not waited for: a process stuck in the kernel (a
# flush to a dead block device) cannot be waited for. Its output goes nowhere, so it holds nothing
# of this script's session open.
bounded() {
  local tenths=$(($1 * 10)) pid state
  shift
  "$@" </dev/null >/dev/null 2>&1 &
  pid=$!
  while :; do
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) # Z: it ended, not yet reaped
    if [ -z "$state" ] || [ "$state" = Z ]; then
      wait "$pid" && return 0
      return 1
    fi
    if [ "$tenths" -le 0 ]; then
      kill -9 "$pid" 2>/dev/null
      return 2
    fi
    sleep 0.1
    tenths=$((tenths - 1))
  done
}

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
  # Bounded: its plain umounts wait on a device that stopped answering (see the pod mounts below).
  bounded "$KILLALL_SECONDS" /usr/local/bin/k3s-killall.sh || true
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

# --- the pod mounts, deepest first -------------------------------------------------
# Each filesystem is asked first (statfs, bounded). One that answers gets a plain umount, bounded
# too (a block device whose filesystem answers statfs from memory may still not take the flush):
# one still held by a process fails and stays, and is named. One that does not answer, to the
# statfs or to the umount in time, is taken off without a flush, once no process holds it: forced
# (umount -f: FUSE and NFS abort their requests), else detached (umount -l: gone from the host's
# mounts, freed by the kernel once unused). Writes not yet on its device are lost with it, as with
# a power off: the copies on other nodes are what count, and with Longhorn's processes gone (the
# check below) nothing on this host reaches them. The paths come from /proc/self/mounts: umount -c
# (no canonicalization) asks the filesystem nothing before the unmount itself.
pod_mounts() {
  awk '$2 ~ /^(\/run\/k3s\/|\/var\/lib\/kubelet\/pods\/|\/var\/lib\/kubelet\/plugins\/|\/run\/netns\/cni-)/ ||
       $1 ~ /^\/dev\/longhorn\// {print $2}' /proc/self/mounts | sort -r
}
mounted() { awk -v p="$1" '$2 == p {found = 1} END {exit !found}' /proc/self/mounts; }
# The processes with a file, their working directory or their root under $1, read from /proc's
# links (the filesystem itself is not asked).
holders() {
  local proc link target
  for proc in /proc/[0-9]*; do
    for link in "$proc/cwd" "$proc/root" "$proc"/fd/*; do
      target=$(readlink "$link" 2>/dev/null) || continue
      case "$target" in "$1" | "$1"/*)
        echo "${proc#/proc/}"
        break
        ;;
      esac
    done
  done
}
# Seconds left of the budget for one more step of at most $1 seconds (at least 1).
allowed() {
  local left=$((UNMOUNT_BUDGET - (SECONDS - unmount_started)))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 1 ] && left=1
  echo "$left"
}
unmount_started=$SECONDS
unflushed=""
held=""
for path in $(pod_mounts); do
  mounted "$path" || continue
  bounded "$(allowed "$PROBE_SECONDS")" stat -f -c %t "$path"
  if [ $? -ne 2 ]; then
    bounded "$(allowed "$UNMOUNT_SECONDS")" umount -c "$path"
    [ $? -eq 2 ] || continue # unmounted, or refused (held): then it stays and is named
  fi
  if mounted "$path"; then
    pids=$(holders "$path")
    if [ -n "$pids" ]; then
      # A process that may still write there is not cut off behind its back: named, the fence stops.
      for pid in $pids; do
        held="$held process:$pid:$(tr ' ' _ <"/proc/$pid/comm" 2>/dev/null)"
      done
      continue
    fi
    bounded "$(allowed "$FORCED_SECONDS")" umount -f -c "$path"
    mounted "$path" && bounded "$(allowed "$FORCED_SECONDS")" umount -l -c "$path"
  fi
  # Gone from the mounts, but not by an unmount that finished: its flush did not happen.
  mounted "$path" || unflushed="$unflushed $path"
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
left="$left$held"
if systemctl is-active --quiet k3s-agent; then
  left="$left unit:k3s-agent"
fi
result unflushed "${unflushed# }"
result left "${left# }"
