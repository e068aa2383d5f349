#!/usr/bin/env bash
# The test command: sets up the lab (Debian packages, Python requirements, the
# control plane, Pulumi CLI and k3s stand-in built from Go modules, the host
# base tree; all cached in $HK3S_LAB_CACHE), runs the static checks, then every
# test. pytest arguments pass through, e.g. `scripts/test.sh -m "not lab"`.
# Run as root on Debian bookworm: the lab boots hosts and a real sshd.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
start=$(date +%s)

bash lab/setup.sh

echo "== static checks"
python_paths=(__main__.py cluster_settings components providers node_operations remote_access host_scripts operator_api operator_cli lab bench tests)
venv/bin/ruff check "${python_paths[@]}"
venv/bin/ruff format --check "${python_paths[@]}"
venv/bin/mypy "${python_paths[@]}"
shellcheck host_scripts/*.sh scripts/*.sh scripts/hk3s lab/*.sh lab/build/*.sh .ci/run

echo "== tests"
# Here the lab is set up, so a lab test that skips is a failure, not a pass.
export HK3S_LAB_REQUIRED=1
# --durations: CI prints the 40 slowest tests, so the time budget can be read from every run.
# Two test modules run side by side (HK3S_TEST_WORKERS, 0 for one at a time): lab tests
# spend much of their time waiting on hosts and timers. A module stays on one worker, so
# its tests share one lab and its fixtures as when run alone. Three are faster (on 2 cores,
# warm: 2343 s against 2704 s, every test passing) but not yet safe: in a cold run with three
# (2026-12-04) a k3s agent restarted by tests/lab/test_teardown.py failed to start, which
# it never did with two; until that is understood, two.
workers=${HK3S_TEST_WORKERS:-2}
venv/bin/python -m pytest -n "$workers" --dist loadfile --durations=40 "$@"
echo "== done in $(($(date +%s) - start)) s"
