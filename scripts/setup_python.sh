#!/usr/bin/env bash
# Creates ./venv (the virtualenv Pulumi.yaml names) and installs the pinned
# requirements into it; quick when nothing changed. Which file: the first argument, else
# $HK3S_REQUIREMENTS, else requirements.txt. A file that carries hashes (requirements.lock)
# is installed with --require-hashes: every package, those it pulls in included, must be
# pinned there and match its hash, so a changed or substituted package stops the install.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
requirements=${1:-${HK3S_REQUIREMENTS:-requirements.txt}}
venv="$repo/venv"
stamp="$venv/.installed-$(sha256sum "$repo/requirements.txt" "$repo/$requirements" | sha256sum | cut -c1-16)"

if [ ! -x "$venv/bin/python" ]; then
  echo "Creating the virtualenv in $venv"
  python3 -m venv "$venv"
fi
if [ ! -e "$stamp" ]; then
  echo "Installing $requirements into $venv"
  hashes=()
  if grep -q -- '--hash=' "$repo/$requirements"; then
    hashes=(--require-hashes --no-deps)
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${hashes[@]}" -r "$repo/$requirements"
  touch "$stamp"
fi
