#!/usr/bin/env bash
# Installs the Debian packages the tests use (run as root); `--lab` adds what
# the lab needs to boot hosts and firewall them.
set -euo pipefail

packages=(openssh-server openssh-client shellcheck iproute2 bc)
if [ "${1:-}" = "--lab" ]; then
  packages+=(debootstrap systemd-container nftables iptables util-linux procps)
  # Pod-capable lab hosts (lab/build/pod_runtime.sh): runc's static seccomp, the pause
  # image's static C build, and the test image's busybox.
  packages+=(libseccomp-dev gcc libc6-dev busybox-static)
fi
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "Installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
