#!/usr/bin/env bash
# Creates ./venv (the virtualenv Pulumi.yaml names) and installs the pinned
# requirements into it; quick when nothing changed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
requirements=${1:-requirements.txt}
venv="$repo/venv"
stamp="$venv/.installed-$(sha256sum "$repo/requirements.txt" "$repo/$requirements" | sha256sum | cut -c1-16)"

if [ ! -x "$venv/bin/python" ]; then
  echo "Creating the virtualenv in $venv"
  python3 -m venv "$venv"
fi
if [ ! -e "$stamp" ]; then
  echo "Installing $requirements into $venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$repo/$requirements"
  touch "$stamp"
fi
