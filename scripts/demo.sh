#!/usr/bin/env bash
# The program doing its job without a Hetzner account, on lab hosts:
#   scripts/demo.sh up     sets up the lab if needed (bash lab/setup.sh), boots a server and two
#                          workers, writes a stack for them and runs the operator CLI on it
#                          (up with its progress, node list, status)
#   scripts/demo.sh down   tears the hosts and the demo's state down
# Run as root on Debian bookworm (the lab boots real hosts). LAB ONLY: see lab/demo.py.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
case "${1:-}" in
  up) bash lab/setup.sh ;;
  down) ;;
  *)
    echo "usage: scripts/demo.sh up|down" >&2
    exit 2
    ;;
esac
exec "$repo/venv/bin/python" -m lab.demo "$1"
