#!/usr/bin/env bash
# Build the lab's real Pulumi CLI and its Python language host from Go modules into
# "$HK3S_LAB_CACHE/bin" (default /var/cache/hk3s-lab/bin), outside the repository:
#
#   pulumi                          github.com/pulumi/pulumi/pkg/v3/cmd/pulumi @ PULUMI_VERSION
#   pulumi-language-python          github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python
#                                   @ PYTHON_HOST_SDK_VERSION (see the note at the pins)
#   pulumi-language-python-exec     script shipped in the sdk/v3 module zip @ PULUMI_VERSION
#   pulumi-resource-pulumi-python   script shipped in the sdk/v3 module zip @ PULUMI_VERSION
#                                   (runs Python dynamic providers)
#
# Only the Go module proxy is used: no release download, no git.  pkg/v3 has local
# replace directives, so `go install pkg@version` is refused; the build runs in small
# generated "tools" modules under "$HK3S_LAB_CACHE/src/pulumi-tools/" that require the
# Pulumi modules and repeat their non-local replace directives (read from the modules'
# own go.mod files, never written by hand), because Go ignores a dependency's replaces.
#
# Go caches: GOMODCACHE="$HK3S_LAB_CACHE/go/mod" and GOCACHE="$HK3S_LAB_CACHE/go/build",
# so a second run is warm and deleting "$HK3S_LAB_CACHE" gives a truly cold build.
#
# Idempotent: a stamp file next to the binaries records the pins; when it matches and
# every file is present, nothing is rebuilt (a changed pin rebuilds).  The CLI is always
# smoke-checked (`pulumi version` must print the pin).
#
# Usage: lab/build/pulumi.sh                  build if needed, then verify
#        lab/build/pulumi.sh --force          rebuild even when the stamp matches
#        lab/build/pulumi.sh --print-version  print the pinned CLI version and exit
set -euo pipefail
# shellcheck source=lab/build/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# ---- pins -------------------------------------------------------------------------
# The CLI: newest pkg/v3 tag the proxy serves; it builds with Go 1.26.8 ("go 1.26.6" in
# its go.mod) and works with the project's Python SDK pulumi==3.272.0.
readonly PULUMI_VERSION="v3.276.0"
# The Python language host.  Since sdk/v3 v3.80.0 it lives in its own module,
# github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3, which is only ever
# published as pseudo-versions, and the module proxy reachable here refuses every
# request for that module (HTTP 403 "This module version is not available", also for
# its version list).  The newest real Pulumi Python language host it does serve is the
# one inside the sdk/v3 module itself, last shipped in sdk/v3 v3.79.0.  That host takes
# the Pulumi.yaml runtime options (virtualenv, toolchain) only as command-line flags,
# which newer CLIs no longer pass: it runs the program with $PULUMI_PYTHON_CMD (or
# python3 from PATH), so point PULUMI_PYTHON_CMD at the project's venv python.
readonly PYTHON_HOST_SDK_VERSION="v3.79.0"
# Bump when the build recipe (flags, layout) changes so cached binaries are redone.
readonly RECIPE=2

readonly TOOLS="$CACHE/src/pulumi-tools"
readonly STAMP="$BIN/.pulumi-stamp"
readonly FILES=(pulumi pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python)
readonly VERSION_VAR="github.com/pulumi/pulumi/sdk/v3/go/common/version.Version"

case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  --print-version) echo "$PULUMI_VERSION"; exit 0 ;;
  -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--force|--print-version]" >&2; exit 2 ;;
esac

# -modcacherw: module cache files stay writable, so the cache dir can simply be deleted.
go_environment "-buildvcs=false -modcacherw"

stamp_content() {
  printf 'pulumi=%s\npython-host-sdk=%s\ngo=%s\nrecipe=%s\n' \
    "$PULUMI_VERSION" "$PYTHON_HOST_SDK_VERSION" "$GO_VERSION" "$RECIPE"
}

mkdir -p "$BIN" "$TOOLS"
lock_build pulumi

up_to_date() {
  local f
  stamp_current "$STAMP" || return 1
  for f in "${FILES[@]}"; do [[ -x $BIN/$f ]] || return 1; done
}

# smoke_check DIR: the CLI in DIR must report exactly the pinned version.
smoke_check() {
  local dir=$1 got
  got=$(PULUMI_SKIP_UPDATE_CHECK=true "$dir/pulumi" version) \
    || die "$dir/pulumi version failed"
  [[ $got == "$PULUMI_VERSION" ]] \
    || die "$dir/pulumi reports version '$got', expected $PULUMI_VERSION"
  log "pulumi version: $got"
}

# ---- helpers ----------------------------------------------------------------------
# module_field MODULE@VERSION FIELD: download the module (into GOMODCACHE) and print one
# field (Dir, GoMod, ...) of `go mod download -json`.
module_field() {
  local info value
  info=$(go -C "$CACHE" mod download -json "$1") || die "cannot download $1 from $GOPROXY"
  value=$(sed -n 's/^[[:space:]]*"'"$2"'": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")
  [[ -n $value ]] || die "no $2 for $1 in: $info"
  printf '%s\n' "$value"
}

# nonlocal_replaces GOMODFILE: print "old[@ver] new@ver" for every replace directive of
# GOMODFILE whose target is a module version (local directory targets are skipped).
nonlocal_replaces() {
  awk '
    /^replace[[:space:]]*\($/ { block = 1; next }
    block && /^\)/            { block = 0; next }
    /^replace[[:space:]]/     { sub(/^replace[[:space:]]+/, ""); line = $0 }
    block                     { line = $0 }
    line != "" {
      sub(/\/\/.*/, "", line)
      n = split(line, f, /[[:space:]]+/)
      # drop empty fields from leading whitespace
      m = 0; for (i = 1; i <= n; i++) if (f[i] != "") g[++m] = f[i]
      if (m == 4 && g[2] == "=>") print g[1], g[3] "@" g[4]
      else if (m == 5 && g[3] == "=>") print g[1] "@" g[2], g[4] "@" g[5]
      line = ""
    }
  ' "$1"
}

# write_tools_module DIR MODULE_PATH TOOL_PACKAGE REQUIREMENT...: (re)create a tools
# module in DIR that requires REQUIREMENTs (module@version), names TOOL_PACKAGE as a
# tool, repeats the REQUIREMENTs' non-local replaces, and resolves go.sum.
write_tools_module() {
  local dir=$1 modpath=$2 tool=$3 req gomod old new
  shift 3
  rm -rf "$dir"
  mkdir -p "$dir"
  {
    printf '// Generated by lab/build/pulumi.sh: a tools module that only builds %s.\n' "$tool"
    printf 'module %s\n\ngo %s\n\ntool %s\n' "$modpath" "${GO_VERSION#go}" "$tool"
  } >"$dir/go.mod"
  for req in "$@"; do
    go -C "$dir" mod edit -require="$req"
    gomod=$(module_field "$req" GoMod)
    while read -r old new; do
      [[ -n $old ]] || continue
      log "  replace $old => $new (from $req's go.mod)"
      go -C "$dir" mod edit -replace="$old=$new"
    done < <(nonlocal_replaces "$gomod")
  done
  go -C "$dir" mod tidy
}

# ---- main -------------------------------------------------------------------------
log "cache: $CACHE (binaries in $BIN, GOMODCACHE=$GOMODCACHE, GOCACHE=$GOCACHE)"
log "pins: pulumi CLI $PULUMI_VERSION (pkg/v3), python language host from sdk/v3 $PYTHON_HOST_SDK_VERSION, $GO_VERSION"

if [[ $FORCE -eq 0 ]] && up_to_date; then
  log "binaries are up to date with the pins; nothing to build (--force rebuilds)"
  smoke_check "$BIN"
  log "timing: warm check $(( $(date +%s) - START_ALL ))s"
  exit 0
fi

STAGE=$(mktemp -d "$CACHE/.pulumi-stage.XXXXXX")

cli_module() {
  write_tools_module "$TOOLS/cli" hk3s-lab/pulumi-tools/cli \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi \
    "github.com/pulumi/pulumi/pkg/v3@$PULUMI_VERSION" \
    "github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION"
}
python_host_module() {
  write_tools_module "$TOOLS/python-host" hk3s-lab/pulumi-tools/python-host \
    github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python \
    "github.com/pulumi/pulumi/sdk/v3@$PYTHON_HOST_SDK_VERSION"
}
# The CLI's start, lazier. Every `pulumi` command (version, stack select, stack output, up...)
# runs the init functions of everything linked in, ~190 ms of CPU before it does anything, and
# 111 ms of that (GODEBUG=inittrace=1) is github.com/ccojocar/zxcvbn-go decoding its word lists
# (frequency: 75 ms; matching: 36 ms) for the one command that uses them: `pulumi config set`
# of a plaintext value whose key looks like a secret's (cmd/pulumi/config looksLikeSecret, and
# `esc env set`). A lab run starts the CLI thousands of times. The build replaces that module with
# a copy whose two tables are built on first use instead: frequency's init becomes a function
# run once by frequency.Load(), matching's init no longer builds its matchers (its Omnimatch
# already builds them when they are missing) and its builder loads the lists first. The
# adjacency graphs stay eager: entropy's package variables read them during init. Same
# results; tests/lab_itself/test_pulumi_cli.py checks the heuristic on the built CLI.
lazy_word_lists() {
  local module dir frequency matching
  module=$(go -C "$TOOLS/cli" list -m -f '{{.Path}}@{{.Version}} {{.Dir}}' github.com/ccojocar/zxcvbn-go) \
    || die "the CLI no longer depends on github.com/ccojocar/zxcvbn-go: drop lazy_word_lists"
  dir=${module#* }
  rm -rf "$TOOLS/zxcvbn-lazy"
  cp -R "$dir" "$TOOLS/zxcvbn-lazy"
  chmod -R u+w "$TOOLS/zxcvbn-lazy"
  frequency="$TOOLS/zxcvbn-lazy/frequency/frequency.go"
  matching="$TOOLS/zxcvbn-lazy/matching/matching.go"
  grep -q '^func init() {$' "$frequency" || die "${module% *}: frequency.go has no init to defer"
  sed -i 's/^func init() {$/func loadLists() {/' "$frequency"
  printf '%s\n' '// Written by hk3s lab/build/pulumi.sh: the word lists, decoded on first use.' \
    'package frequency' '' 'import "sync"' '' 'var listsOnce sync.Once' '' \
    '// Load decodes the lists into Lists, once.' 'func Load() { listsOnce.Do(loadLists) }' \
    >"$TOOLS/zxcvbn-lazy/frequency/lazy.go"
  if ! grep -q '^	loadFrequencyList()$' "$matching" || ! grep -q '^func loadFrequencyList() {$' "$matching"; then
    die "${module% *}: matching.go no longer builds its matchers in init through loadFrequencyList"
  fi
  sed -i -e '/^func init() {$/,/^}$/ s/^	loadFrequencyList()$/	\/\/ built on first use (Omnimatch)/' \
    -e 's/^func loadFrequencyList() {$/func loadFrequencyList() {\n	frequency.Load()/' "$matching"
  go -C "$TOOLS/cli" mod edit -replace="github.com/ccojocar/zxcvbn-go=../zxcvbn-lazy"
  log "${module% *}: word lists built on first use (copy in $TOOLS/zxcvbn-lazy)"
}

build_cli() {
  go -C "$TOOLS/cli" build -trimpath \
    -ldflags "-s -w -X $VERSION_VAR=$PULUMI_VERSION" \
    -o "$STAGE/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
}
build_python_host() {
  go -C "$TOOLS/python-host" build -trimpath \
    -ldflags "-s -w -X $VERSION_VAR=$PYTHON_HOST_SDK_VERSION" \
    -o "$STAGE/pulumi-language-python" github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python
}
copy_scripts() {
  local sdk
  sdk=$(module_field "github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION" Dir)
  install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$STAGE/pulumi-language-python-exec"
  install -m 0755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$STAGE/pulumi-resource-pulumi-python"
}

timed "resolve and download modules (pulumi CLI)" cli_module
timed "defer the CLI's word lists to first use" lazy_word_lists
timed "resolve and download modules (python language host)" python_host_module
timed "copy the Python scripts from sdk/v3@$PULUMI_VERSION" copy_scripts
timed "build pulumi $PULUMI_VERSION" build_cli
timed "build pulumi-language-python (sdk/v3 $PYTHON_HOST_SDK_VERSION)" build_python_host
smoke_check "$STAGE"
log "pulumi-language-python: $(go version -m "$STAGE/pulumi-language-python" \
  | awk '($1 == "mod" || $1 == "dep") && $2 == "github.com/pulumi/pulumi/sdk/v3" { print "built from " $2 "@" $3 }')"

# Install: move the new files over the old ones, then write the stamp last.
rm -f "$STAMP"
for f in "${FILES[@]}"; do mv -f "$STAGE/$f" "$BIN/$f"; done
stamp_content >"$STAMP"
log "installed into $BIN: ${FILES[*]}"

log "timings of this build (cold when the Go caches under $CACHE/go were empty):"
for t in "${TIMINGS[@]}"; do log "  $t"; done
log "timing: total $(( $(date +%s) - START_ALL ))s"
