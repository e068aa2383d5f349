#!/usr/bin/env bash
# Build the lab's real Kubernetes control-plane binaries from the Go module proxy:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (module k8s.io/kubernetes)
#   kine                                             (module github.com/k3s-io/kine, SQLite)
# into "$HK3S_LAB_CACHE/bin" (default /var/cache/hk3s-lab/bin), outside the repository.
#
# Only the Go module proxy is needed: no container registry, release download or git.
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...)
# at v0.0.0 and replaces them with local ./staging directories that a module download
# does not contain, so the build happens in a small generated "tools" module that
# requires k8s.io/kubernetes and replaces every staging module with its published
# v0.<minor>.<patch> of the same release.  The replace list is derived from
# k8s.io/kubernetes's own go.mod, never written by hand.
#
# Idempotent: a stamp file next to the binaries records the pins; when it matches and
# every binary is present, nothing is rebuilt (a changed pin rebuilds everything).
# The binaries are always smoke-checked (each one is run and reports its version).
#
# Usage: lab/build/kube.sh            build if needed, then verify
#        lab/build/kube.sh --force    rebuild even when the stamp matches
#        lab/build/kube.sh --print-version   print the pinned Kubernetes version and exit
# Environment: HK3S_LAB_CACHE (cache dir), HK3S_GOTOOLCHAIN (default "local": never
# download a Go toolchain), GOPROXY.  "$HK3S_LAB_CACHE/bin/.kube-stamp" holds the pins
# as key=value lines (kubernetes=v1.X.Y is the version kubelets must match).
set -euo pipefail

# ---- pins -------------------------------------------------------------------------
# Newest k8s.io/kubernetes release served by the proxy whose go.mod accepts Go 1.26.x
# (v1.37.2: "go 1.26.0"); kine v0.17.5 is the newest kine the proxy serves.
readonly KUBE_VERSION="v1.37.2"
readonly KINE_VERSION="v0.17.5"
# Bump when the build recipe (flags, tags, layout) changes so cached binaries are redone.
readonly RECIPE=1

readonly CACHE="${HK3S_LAB_CACHE:-/var/cache/hk3s-lab}"
readonly BIN="$CACHE/bin"
readonly TOOLS="$CACHE/src/kube-tools"
readonly STAMP="$BIN/.kube-stamp"
readonly BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kine)

FORCE=0
case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  --print-version) echo "$KUBE_VERSION"; exit 0 ;;
  -h|--help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
  *) echo "usage: $0 [--force|--print-version]" >&2; exit 2 ;;
esac

# ---- logging and timing -----------------------------------------------------------
START_ALL=$(date +%s)
log() { printf '[kube.sh %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }
# timed LABEL CMD...: run CMD and print how long it took (a failure ends the script
# through set -e; the EXIT trap then reports it).
timed() {
  local label=$1 t0
  shift
  t0=$(date +%s)
  log "$label ..."
  "$@"
  log "$label done in $(( $(date +%s) - t0 ))s"
}
STAGE=""
on_exit() {
  local rc=$?
  [[ -z $STAGE ]] || rm -rf "$STAGE"
  if [[ $rc -ne 0 ]]; then
    log "FAILED (exit $rc) after $(( $(date +%s) - START_ALL ))s" >&2
  fi
}
trap on_exit EXIT

# ---- Go environment ---------------------------------------------------------------
command -v go >/dev/null || die "go is not installed"
# Never fetch another toolchain behind our back: a pin that needs a newer Go must fail
# loudly here (set HK3S_GOTOOLCHAIN, e.g. go1.27.3, to allow a download from the proxy).
export GOTOOLCHAIN="${HK3S_GOTOOLCHAIN:-local}"
export GOFLAGS="-buildvcs=false"
# Go's caches live in the lab cache too, so an empty HK3S_LAB_CACHE is a truly cold build.
export GOMODCACHE="$CACHE/go/mod"
export GOCACHE="$CACHE/go/build"
export CGO_ENABLED=0   # static binaries (they run inside Debian bookworm containers)
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
GO_VERSION=$(go env GOVERSION)
readonly GO_VERSION

KUBE_MINOR=${KUBE_VERSION#v1.}       # 37.2
KUBE_MINOR=${KUBE_MINOR%%.*}         # 37
readonly KUBE_MINOR
readonly STAGING_VERSION="v0.${KUBE_VERSION#v1.}"   # v0.37.2

stamp_content() {
  printf 'kubernetes=%s\nstaging=%s\nkine=%s\ngo=%s\nrecipe=%s\n' \
    "$KUBE_VERSION" "$STAGING_VERSION" "$KINE_VERSION" "$GO_VERSION" "$RECIPE"
}

mkdir -p "$BIN" "$TOOLS"
# Serialise concurrent runs (two lab hosts asking for the binaries at once).
exec 9>"$CACHE/.kube.lock"
if ! flock -n 9; then
  log "another kube.sh holds $CACHE/.kube.lock; waiting"
  flock 9
fi

up_to_date() {
  local b
  [[ -f $STAMP ]] || return 1
  [[ "$(cat "$STAMP")" == "$(stamp_content)" ]] || return 1
  for b in "${BINARIES[@]}"; do [[ -x $BIN/$b ]] || return 1; done
}

# ---- tools module for k8s.io/kubernetes --------------------------------------------
# Writes $TOOLS/go.mod from k8s.io/kubernetes's own go.mod and resolves go.sum.
prepare_tools_module() {
  local info modfile infofile staging seed stray
  info=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION") \
    || die "cannot download k8s.io/kubernetes@$KUBE_VERSION from $GOPROXY"
  modfile=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")
  infofile=$(sed -n 's/^[[:space:]]*"Info": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")
  [[ -f $modfile ]] || die "no go.mod for k8s.io/kubernetes@$KUBE_VERSION in: $info"

  # Staging modules: those k8s.io/kubernetes replaces with ./staging/src/..., kept only
  # when it also requires them at v0.0.0 (the sample-* ones are not required).
  staging=$(awk '
    $2 == "=>" && $3 ~ /^\.\/staging\// { rep[$1] = 1 }
    $1 == "replace" && $3 == "=>" && $4 ~ /^\.\/staging\// { rep[$2] = 1 }
    $1 ~ /^k8s\.io\// && $2 == "v0.0.0" { req[$1] = 1 }
    $1 == "require" && $2 ~ /^k8s\.io\// && $3 == "v0.0.0" { req[$2] = 1 }
    END { for (m in rep) if (m in req) print m }
  ' "$modfile" | LC_ALL=C sort)
  [[ -n $staging ]] || die "found no staging modules in $modfile"
  log "k8s.io/kubernetes@$KUBE_VERSION has $(wc -l <<<"$staging") staging modules -> $STAGING_VERSION"

  seed=$(
    echo "// Generated by lab/build/kube.sh from k8s.io/kubernetes@$KUBE_VERSION's go.mod. Do not edit."
    echo "module hk3s-lab/kube-tools"
    echo
    echo "go $(awk '$1 == "go" { print $2; exit }' "$modfile")"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "tool ("
    echo "	k8s.io/kubernetes/cmd/kube-apiserver"
    echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
    echo "	k8s.io/kubernetes/cmd/kube-scheduler"
    echo "	k8s.io/kubernetes/cmd/kubectl"
    # Resolved here for lab/build/pod_runtime.sh, which builds the kubelet as k3s embeds it.
    echo "	k8s.io/kubernetes/cmd/kubelet"
    echo ")"
    echo
    echo "replace ("
    while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"; done <<<"$staging"
    echo ")"
  )
  # Regenerate and re-resolve only when the seed changed (go mod tidy rewrites go.mod).
  if [[ -f $TOOLS/go.mod.seed && -f $TOOLS/go.sum && "$(cat "$TOOLS/go.mod.seed")" == "$seed" ]]; then
    log "tools module $TOOLS is current"
  else
    printf '%s\n' "$seed" >"$TOOLS/go.mod"
    rm -f "$TOOLS/go.sum" "$TOOLS/go.mod.seed"
    (cd "$TOOLS" && timed "go mod tidy (resolve and download modules)" go mod tidy)
    printf '%s\n' "$seed" >"$TOOLS/go.mod.seed"
  fi
  # Every k8s.io staging module must have resolved to the one release.
  # shellcheck disable=SC2086  # $staging is a whitespace-separated module list
  stray=$(cd "$TOOLS" && go list -m -f '{{.Path}} {{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' $staging \
    | awk -v want="$STAGING_VERSION" '$2 != want')
  [[ -z $stray ]] || die "staging modules not at $STAGING_VERSION: $stray"

  # buildDate: the release's publication time from the proxy's .info (reproducible).
  KUBE_BUILD_DATE=$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$infofile" 2>/dev/null || true)
  KUBE_BUILD_DATE=${KUBE_BUILD_DATE:-1970-01-01T00:00:00Z}
  log "buildDate $KUBE_BUILD_DATE"
}

kube_ldflags() {
  local pkg flags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$KUBE_VERSION"
    flags+=" -X $pkg.gitMajor=1"
    flags+=" -X $pkg.gitMinor=$KUBE_MINOR"
    flags+=" -X $pkg.gitCommit="
    flags+=" -X $pkg.gitTreeState=archive"
    flags+=" -X $pkg.buildDate=$KUBE_BUILD_DATE"
  done
  printf '%s' "$flags"
}

build_kube() {
  local out=$1 name
  # Same build tags as upstream's release builds; static, no cgo.
  for name in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    (cd "$TOOLS" && timed "go build $name $KUBE_VERSION" \
      go build -trimpath -tags selinux,notest,grpcnotrace \
        -ldflags "$(kube_ldflags)" -o "$out/$name" "k8s.io/kubernetes/cmd/$name")
  done
}

build_kine() {
  local out=$1
  # go install MODULE@VERSION builds kine with exactly its own go.mod pins.  With cgo
  # off kine's SQLite driver is modernc.org/sqlite (pure Go), so the binary is static.
  timed "go install kine $KINE_VERSION" \
    env GOBIN="$out" go install -trimpath \
      -ldflags "-s -w -X github.com/k3s-io/kine/pkg/version.Version=$KINE_VERSION -X github.com/k3s-io/kine/pkg/version.GitCommit=module" \
      "github.com/k3s-io/kine@$KINE_VERSION"
}

# ---- verification -----------------------------------------------------------------
linkage() {
  if command -v readelf >/dev/null && readelf -l "$1" 2>/dev/null | grep -q 'program interpreter'; then
    echo dynamic
  else
    echo static
  fi
}

verify() {
  local out v
  out=$("$BIN/kube-apiserver" --version) || die "kube-apiserver --version failed"
  [[ $out == "Kubernetes $KUBE_VERSION" ]] || die "kube-apiserver reports '$out', want Kubernetes $KUBE_VERSION"
  log "kube-apiserver: $out ($(linkage "$BIN/kube-apiserver"))"
  out=$("$BIN/kube-controller-manager" --version) || die "kube-controller-manager --version failed"
  [[ $out == "Kubernetes $KUBE_VERSION" ]] || die "kube-controller-manager reports '$out', want Kubernetes $KUBE_VERSION"
  log "kube-controller-manager: $out ($(linkage "$BIN/kube-controller-manager"))"
  out=$("$BIN/kube-scheduler" --version) || die "kube-scheduler --version failed"
  [[ $out == "Kubernetes $KUBE_VERSION" ]] || die "kube-scheduler reports '$out', want Kubernetes $KUBE_VERSION"
  log "kube-scheduler: $out ($(linkage "$BIN/kube-scheduler"))"
  out=$("$BIN/kubectl" version --client -o yaml) || die "kubectl version --client failed"
  v=$(sed -n 's/^ *gitVersion: *//p' <<<"$out" | head -n1)
  [[ $v == "$KUBE_VERSION" ]] || die "kubectl reports gitVersion '$v', want $KUBE_VERSION"
  log "kubectl: client $v ($(linkage "$BIN/kubectl"))"
  out=$("$BIN/kine" --version) || die "kine --version failed"
  [[ $out == *"$KINE_VERSION"* ]] || die "kine reports '$out', want $KINE_VERSION"
  log "kine: $out ($(linkage "$BIN/kine"))"
}

# ---- main -------------------------------------------------------------------------
log "cache $CACHE; pins: kubernetes $KUBE_VERSION (staging $STAGING_VERSION), kine $KINE_VERSION; $GO_VERSION"
if [[ $FORCE -eq 0 ]] && up_to_date; then
  log "binaries in $BIN match the pins; nothing to build"
else
  rm -f "$STAMP"
  timed "prepare tools module" prepare_tools_module
  STAGE=$(mktemp -d "$CACHE/build.XXXXXX")
  timed "build kubernetes binaries" build_kube "$STAGE"
  timed "build kine" build_kine "$STAGE"
  for b in "${BINARIES[@]}"; do
    [[ -x $STAGE/$b ]] || die "build produced no $b"
    mv -f "$STAGE/$b" "$BIN/$b"
  done
  stamp_content >"$STAMP"
  log "installed ${BINARIES[*]} into $BIN"
fi
timed "verify binaries run" verify
log "all done in $(( $(date +%s) - START_ALL ))s"
