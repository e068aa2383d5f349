#!/usr/bin/env bash
# The test command: installs what the tests need, runs the static checks, then
# every test (pytest arguments pass through, e.g. `scripts/test.sh -m "not lab"`).
# Run as root on Debian bookworm: the lab boots hosts and a real sshd.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
start=$(date +%s)

bash scripts/setup_system.sh
bash scripts/setup_python.sh requirements-dev.txt

echo "== static checks"
python_paths=(__main__.py cluster_settings components providers node_operations remote_access host_scripts tests)
venv/bin/ruff check "${python_paths[@]}"
venv/bin/ruff format --check "${python_paths[@]}"
venv/bin/mypy "${python_paths[@]}"
shellcheck host_scripts/*.sh scripts/*.sh

echo "== tests"
venv/bin/python -m pytest "$@"
echo "== done in $(($(date +%s) - start)) s"
