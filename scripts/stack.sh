#!/usr/bin/env bash
# Runs the program against one stack: `scripts/stack.sh preview|up|refresh|destroy [--stack NAME] [pulumi args...]`.
# Prepares the Python environment and keeps the state where your Pulumi CLI does: PULUMI_BACKEND_URL
# when set, else the backend `pulumi login` chose, else (never logged in) file://$HOME/.hk3s-state.
# Creates the stack on first use with HK3S_SECRETS_PROVIDER when set (a key service's URL), else the
# passphrase for a file:// or s3:// backend: PULUMI_CONFIG_PASSPHRASE, which you choose and must keep,
# asked for only when the stack uses it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
action=${1:-}
case "$action" in
  preview | up | refresh | destroy) shift ;;
  *)
    echo "usage: scripts/stack.sh preview|up|refresh|destroy [--stack NAME] [pulumi args...]" >&2
    exit 2
    ;;
esac
stack=dev
if [ "${1:-}" = "--stack" ]; then
  stack=${2:?--stack needs a name}
  # The name becomes part of file paths (Pulumi.<name>.yaml, the backend's state and locks).
  case "$stack" in
    *..* | */* | *\\* | -* | "")
      echo "'$stack' is not a stack name: use letters, digits, '-', '_' and '.', no path separator and no '..'" >&2
      exit 2
      ;;
  esac
  shift 2
fi

if [ ! -f "$repo/Pulumi.$stack.yaml" ]; then
  echo "Pulumi.$stack.yaml does not exist: copy Pulumi.dev.yaml to it and edit it (see docs/configuration.md)." >&2
  exit 2
fi

# The lab's Pulumi CLI, when it has been built, serves where no other is installed.
lab_bin=${HK3S_LAB_CACHE:-/var/cache/hk3s-lab}/bin
if ! command -v pulumi >/dev/null && [ -x "$lab_bin/pulumi" ]; then
  PATH="$lab_bin:$PATH"
fi
if ! command -v pulumi >/dev/null; then
  echo "The Pulumi CLI is not installed: see https://www.pulumi.com/docs/install/ (docs/getting-started-hetzner.md#prerequisites)." >&2
  exit 2
fi

"$repo/scripts/setup_python.sh" >&2

export PULUMI_SKIP_UPDATE_CHECK=true
# Older Python language hosts (such as the lab's) run the program with this interpreter
# instead of reading Pulumi.yaml's virtualenv; current ones ignore it.
export PULUMI_PYTHON_CMD="$repo/venv/bin/python"
# The backend and secrets provider, by the rule the operator API follows (operator_api.state_backend).
chosen=$("$repo/venv/bin/python" -c 'import sys; sys.path.insert(0, sys.argv[1]); from operator_api.state_backend import main; sys.exit(main(sys.argv[1:]))' "$repo" "$stack" ${HK3S_SECRETS_PROVIDER:+"$HK3S_SECRETS_PROVIDER"}) || exit 2
{ read -r backend_url; read -r _source; read -r secrets_provider; } <<<"$chosen"
export PULUMI_BACKEND_URL=$backend_url
if [ "$secrets_provider" = passphrase ] && [ -z "${PULUMI_CONFIG_PASSPHRASE:-}" ] && [ -z "${PULUMI_CONFIG_PASSPHRASE_FILE:-}" ]; then
  echo "PULUMI_CONFIG_PASSPHRASE is not set: choose a passphrase that encrypts this stack's secrets," >&2
  echo "export it (or PULUMI_CONFIG_PASSPHRASE_FILE) and run again. Keep it: the secrets cannot be read without it." >&2
  echo "Or make the stack with a key service: HK3S_SECRETS_PROVIDER='awskms://KEY?region=REGION' (docs/ci.md)." >&2
  exit 2
fi
# A CI run keeps no state on its runner: the runner's disk goes with it, and with it the record
# of every server and the pinned host keys (HK3S_ALLOW_LOCAL_STATE=1: a runner that keeps its disk).
truthy() { case "$(printf '%s' "${1:-}" | tr '[:upper:]' '[:lower:]')" in "" | 0 | false | no) return 1 ;; *) return 0 ;; esac; }
if truthy "${CI:-}" && ! truthy "${HK3S_ALLOW_LOCAL_STATE:-}"; then
  case "$PULUMI_BACKEND_URL" in
    file://*)
      echo "this is a CI run (CI is set) and the state would be kept in $PULUMI_BACKEND_URL on this machine: a runner's disk goes with the runner, and with it the record of every server and the pinned host keys. Set PULUMI_BACKEND_URL to a shared backend (an s3:// bucket, or Pulumi Cloud; README, One stack per environment, in CI), or set HK3S_ALLOW_LOCAL_STATE=1 on a runner that keeps its disk" >&2
      exit 2
      ;;
  esac
fi
# The state is for this user only: a state directory the script makes is 0700, and the
# default one (made 0755 by earlier releases) is tightened.
case "$PULUMI_BACKEND_URL" in
  file://*) (umask 077 && mkdir -p "${PULUMI_BACKEND_URL#file://}") ;;
esac
if [ "$PULUMI_BACKEND_URL" = "file://$HOME/.hk3s-state" ] && [ -O "$HOME/.hk3s-state" ] && [ ! -L "$HOME/.hk3s-state" ]; then
  chmod 700 "$HOME/.hk3s-state"
fi

cd "$repo"
if ! pulumi stack select "$stack" 2>/dev/null; then
  echo "Creating stack $stack in $PULUMI_BACKEND_URL (secrets: ${secrets_provider:-the backend service})" >&2
  pulumi stack init "$stack" ${secrets_provider:+--secrets-provider "$secrets_provider"}
fi
# The engine's default of 8 operations at once would queue the joins of a larger batch of
# workers; node operations are spread over provider processes to run side by side.
# A refresh or a destroy runs the program too (--run-program): the program opens the forward to
# the Kubernetes API (remote_access/api_forward.py) that the Kubernetes provider's resources
# (Longhorn) are read and deleted through; without it they find no API.
program=()
case "$action" in
  refresh | destroy) program=(--run-program) ;;
esac
exec pulumi "$action" --stack "$stack" --parallel "${HK3S_PARALLEL:-32}" ${program[@]+"${program[@]}"} "$@"
