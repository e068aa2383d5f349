#!/usr/bin/env bash
# Installs or adopts k3s as a server or agent, idempotently.
#   k3s_install.sh ROLE VERSION SHA256
# ROLE is server or agent. SHA256 is the binary's checksum, or "-" to take it
# from the release. Before this runs, the program may have uploaded
#   /usr/local/bin/k3s.hk3s-upload.gz       the binary, gzipped (air-gapped install)
#   /etc/rancher/k3s/config.yaml.hk3s-new   the wanted config
# Prints "result <name> <value>" lines; each step is skipped when already done.
set -euo pipefail

role=$1
version=$2
want_sha=$3
bin=/usr/local/bin/k3s
upload=$bin.hk3s-upload
config=/etc/rancher/k3s/config.yaml
unit=k3s
[ "$role" = agent ] && unit=k3s-agent

result() { printf 'result %s %s\n' "$1" "$2"; }
fail() {
  printf 'error %s\n' "$1" >&2
  exit 1
}

# A run killed after it changed the binary, the config or the unit but before it restarted k3s
# leaves k3s running what it started with (a replaced binary runs on from its deleted file), and
# the run that resumes finds nothing left to change. So each change is recorded here before it
# is made, and the record goes only once k3s has been started or restarted after it: a record
# found means a restart is owed.
pending=/etc/rancher/k3s/hk3s-restart-pending
owe_restart() {
  mkdir -p "${pending%/*}"
  : >"$pending"
}

installed_version() {
  if [ -x "$bin" ]; then "$bin" --version 2>/dev/null | awk 'NR == 1 {print $3}'; fi
}

# --- binary -----------------------------------------------------------------
binary_changed=no
if [ -f "$upload.gz" ]; then
  gunzip -f "$upload.gz"
fi
if [ -f "$upload" ]; then
  have=$(sha256sum "$upload" | cut -d' ' -f1)
  if [ "$want_sha" != "-" ] && [ "$have" != "$want_sha" ]; then
    rm -f "$upload"
    fail "uploaded k3s binary has SHA-256 $have, expected $want_sha; check hk3s:cluster.k3s_sha256"
  fi
  chmod 0755 "$upload"
  if [ ! -x "$bin" ] || [ "$(sha256sum "$bin" | cut -d' ' -f1)" != "$have" ]; then
    owe_restart
    mv -f "$upload" "$bin"
    binary_changed=yes
  else
    rm -f "$upload"
  fi
elif [ "$(installed_version)" != "$version" ]; then
  url_version=${version//+/%2B}
  base="https://github.com/k3s-io/k3s/releases/download/$url_version"
  # k3s's release assets per architecture: k3s + sha256sum-amd64.txt, k3s-arm64 + sha256sum-arm64.txt.
  case "$(uname -m)" in
    x86_64) asset=k3s sums=sha256sum-amd64.txt ;;
    aarch64) asset=k3s-arm64 sums=sha256sum-arm64.txt ;;
    *) fail "this host is $(uname -m); k3s is installed on x86_64 and aarch64 hosts only" ;;
  esac
  tmp=$(mktemp)
  trap 'rm -f "$tmp"' EXIT
  curl -fsSL --retry 3 -o "$tmp" "$base/$asset" || fail "downloading $asset $version from $base failed; upload it instead (hk3s:cluster.k3s_binary)"
  if [ "$want_sha" = "-" ]; then
    want_sha=$(curl -fsSL --retry 3 "$base/$sums" | awk -v asset="$asset" '$2 == asset {print $1}')
  fi
  have=$(sha256sum "$tmp" | cut -d' ' -f1)
  [ "$have" = "$want_sha" ] || fail "downloaded k3s has SHA-256 $have, expected $want_sha"
  owe_restart
  install -m 0755 "$tmp" "$bin"
  binary_changed=yes
fi
got=$(installed_version)
[ "$got" = "$version" ] || fail "k3s on the host is $got, expected $version"
ln -sf "$bin" /usr/local/bin/kubectl
result binary "$([ "$binary_changed" = yes ] && echo installed || echo unchanged)"

# --- config -----------------------------------------------------------------
config_changed=no
if [ -f "$config.hk3s-new" ]; then
  if [ -f "$config" ] && cmp -s "$config.hk3s-new" "$config"; then
    rm -f "$config.hk3s-new"
  else
    owe_restart
    mv -f "$config.hk3s-new" "$config"
    config_changed=yes
  fi
fi
chmod 0600 "$config"
result config "$([ "$config_changed" = yes ] && echo changed || echo unchanged)"

# --- systemd unit -----------------------------------------------------------
unit_file=/etc/systemd/system/$unit.service
unit_text="[Unit]
Description=Lightweight Kubernetes ($role), managed by hk3s
Documentation=https://k3s.io
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
ExecStart=$bin $role
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s

[Install]
WantedBy=multi-user.target"
unit_changed=no
if [ ! -f "$unit_file" ] || [ "$(cat "$unit_file")" != "$unit_text" ]; then
  owe_restart
  printf '%s\n' "$unit_text" >"$unit_file"
  systemctl daemon-reload
  unit_changed=yes
fi
systemctl enable --quiet "$unit"

# --- a fence's drop-in left by a worker given up ---------------------------------
# The fence's drop-in keeps the agent from starting (ConditionPathExists). A worker given up
# leaves the stack with its host as it was, drop-in included. A join runs this only after its
# preflight found no fence recorded on the worker's Node (a fenced worker's join stops before
# any change), so a drop-in here is a leftover of a fence that ended with the give-up: it goes,
# or the agent would never start and the join would time out waiting for its registration.
fence_drop_in=/etc/systemd/system/$unit.service.d/hk3s-fence.conf
if [ "$role" = agent ] && [ -e "$fence_drop_in" ]; then
  rm -f "$fence_drop_in"
  systemctl daemon-reload
  result fence_drop_in removed
fi

# --- start ------------------------------------------------------------------
# --no-block: the program watches readiness itself, with a deadline and a diagnosis.
# The units are Type=notify and k3s reports READY only once its start is done (the agent once
# its Node is configured), so a k3s stuck in its start (a refused token, an unreachable API, a
# CA hash that does not match) stays "activating", retrying with the token and config it read
# when it started; `systemctl start` does nothing to it. Only a started unit ("active") has
# read what this run wrote; any other start in progress is stopped and started again. The stop
# waits for the old process to exit, so the log from log_since on is the new process's alone.
state=$(systemctl is-active "$unit" || true)
restart_owed=no
[ -e "$pending" ] && restart_owed=yes
# A k3s whose binary was replaced under it by other hands runs on from the deleted file.
main_pid=$(systemctl show -p MainPID --value "$unit" 2>/dev/null || echo 0)
if [ "${main_pid:-0}" != 0 ] && [ "$(readlink "/proc/$main_pid/exe" 2>/dev/null || true)" != "$bin" ]; then
  restart_owed=yes
fi
case $state in
  active)
    if [ "$binary_changed$config_changed$unit_changed$restart_owed" != nononono ]; then
      result log_since "$(date '+%Y-%m-%d %H:%M:%S.%6N')"
      systemctl restart --no-block "$unit"
      result service restarted
    else
      result service running
    fi
    ;;
  inactive | failed)
    result log_since "$(date '+%Y-%m-%d %H:%M:%S.%6N')"
    systemctl start --no-block "$unit"
    result service started
    ;;
  *)
    systemctl stop "$unit"
    result log_since "$(date '+%Y-%m-%d %H:%M:%S.%6N')"
    systemctl start --no-block "$unit"
    result service restarted
    ;;
esac
# The restart or start is under way: it reads the binary, config and unit now in place.
rm -f "$pending"
