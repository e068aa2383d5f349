#!/usr/bin/env bash
# Build the lab's k3s stand-in (lab/k3s_standin, LAB ONLY: never shipped) into
#   "$HK3S_LAB_CACHE/bin/k3s"          static binary (CGO_ENABLED=0)
#   "$HK3S_LAB_CACHE/bin/k3s.sha256"   "<sha256>  k3s", as k3s's sha256sum files list it
#   "$HK3S_LAB_CACHE/bin/k3s-patch", "k3s-minor" (and their .sha256): the same sources
#       stamped with the next patch release (v1.<minor>.<patch+1>+k3s1) and the next minor
#       release (v1.<minor+1>.0+k3s1), for the lab's upgrade tests. Only the version string
#       differs (the control plane stays kube.sh's); the link reuses the first build's cache.
# (HK3S_LAB_CACHE defaults to /var/cache/hk3s-lab), outside the repository.
#
# The stand-in reports the k3s version v<Kubernetes release>+k3s1, where the
# Kubernetes release is the one lab/build/kube.sh pins (asked with --print-version,
# nothing is built by it here); its k8s.io modules in go.mod must be at the same
# release (v0.<minor>.<patch>), which is checked. Only the Go module proxy is used.
#
# Idempotent: a stamp next to the binary records a hash of the sources (go.mod,
# go.sum, non-test *.go, this script and common.sh) and the pinned versions; when it matches and
# the binary still has the recorded checksum, nothing is rebuilt. The binary is
# always smoke-checked (it must report the expected version). A build first runs
# the stand-in's Go unit tests.
#
# Usage: lab/build/k3s_standin.sh           build if needed, then verify
#        lab/build/k3s_standin.sh --force   rebuild even when the stamp matches
#        lab/build/k3s_standin.sh --print-releases   print "<binary> <k3s version>" per binary
#            and exit (lab/build/pod_runtime.sh links a kubelet for each release)
set -euo pipefail
# shellcheck source=lab/build/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly SRC="$HERE/../k3s_standin"
readonly OUT="$BIN/k3s"
readonly SUMFILE="$BIN/k3s.sha256"
readonly STAMP="$BIN/.k3s-standin-stamp"
# Bump when the build recipe (flags, layout) changes.
readonly RECIPE=1

case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  --print-releases) PRINT_RELEASES=1 ;;
  -h|--help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
  *) echo "usage: $0 [--force|--print-releases]" >&2; exit 2 ;;
esac

[[ -f $SRC/go.mod ]] || die "no Go module at $SRC"
go_environment "-buildvcs=false -mod=readonly"

KUBE_VERSION=$(bash "$HERE/kube.sh" --print-version)
[[ $KUBE_VERSION =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "kube.sh --print-version gave '$KUBE_VERSION'"
readonly KUBE_VERSION
# The lab's joins must run at a k3s the product accepts: MIN_K3S_VERSION in cluster_settings/models.py.
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
(( minor >= 30 )) || die "kube.sh pins $KUBE_VERSION, below the product's k3s floor v1.30.0"
readonly K3S_VERSION="${KUBE_VERSION}+k3s1"
patch=${KUBE_VERSION##*.}
readonly PATCH_VERSION="v1.${minor}.$((patch + 1))+k3s1"
readonly MINOR_VERSION="v1.$((minor + 1)).0+k3s1"
readonly STAGING_VERSION="v0.${KUBE_VERSION#v1.}"

# The binaries: file name and the version it is stamped with.
readonly STAMPED=("k3s $K3S_VERSION" "k3s-patch $PATCH_VERSION" "k3s-minor $MINOR_VERSION")
if [[ ${PRINT_RELEASES:-0} -eq 1 ]]; then
  printf '%s\n' "${STAMPED[@]}"
  exit 0
fi

# Every k8s.io module the stand-in requires directly must be at kube.sh's release.
check_pins() {
  local mods bad
  mods=$(awk '$1 ~ /^k8s\.io\// && $2 ~ /^v0\./ && $0 !~ /indirect/ { print $1, $2 }
              $1 == "require" && $2 ~ /^k8s\.io\// && $3 ~ /^v0\./ { print $2, $3 }' "$SRC/go.mod")
  [[ -n $mods ]] || die "go.mod requires no k8s.io module"
  bad=$(awk -v want="$STAGING_VERSION" '$2 != want' <<<"$mods")
  [[ -z $bad ]] || die "go.mod pins k8s.io modules off $STAGING_VERSION (kube.sh's $KUBE_VERSION): $bad"
}

source_hash() {
  (
    cd "$SRC"
    find . -maxdepth 1 -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) ! -name '*_test.go' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
    sha256sum <"$HERE/k3s_standin.sh"
    sha256sum <"$HERE/common.sh"
  ) | sha256sum | cut -c1-64
}

check_pins
SRC_HASH=$(source_hash)
readonly SRC_HASH
readonly GIT_COMMIT=${SRC_HASH:0:8}

stamp_content() {
  printf 'source=%s\nk3s=%s %s %s\nkubernetes=%s\ngo=%s\nrecipe=%s\n' \
    "$SRC_HASH" "$K3S_VERSION" "$PATCH_VERSION" "$MINOR_VERSION" "$KUBE_VERSION" "$GO_VERSION" "$RECIPE"
}

mkdir -p "$BIN"
lock_build k3s-standin

up_to_date() {
  local entry name
  stamp_current "$STAMP" || return 1
  for entry in "${STAMPED[@]}"; do
    name=${entry%% *}
    [[ -x $BIN/$name && -f $BIN/$name.sha256 ]] || return 1
    [[ "$(cut -d' ' -f1 "$BIN/$name.sha256")" == "$(sha256sum "$BIN/$name" | cut -c1-64)" ]] || return 1
  done
}

# link NAME VERSION: the stand-in stamped with VERSION, as $BIN/NAME and its sha256 file.
link() {
  local name=$1 stamped=$2
  log "go build k3s stand-in $stamped ($GIT_COMMIT) as $name ..."
  TMPOUT=$(mktemp "$BIN/.k3s.XXXXXX")
  (cd "$SRC" && go build -trimpath \
    -ldflags "-s -w -X main.version=$stamped -X main.gitCommit=$GIT_COMMIT" \
    -o "$TMPOUT" .)
  chmod 0755 "$TMPOUT"
  mv -f "$TMPOUT" "$BIN/$name"
  TMPOUT=""
  printf '%s  %s\n' "$(sha256sum "$BIN/$name" | cut -c1-64)" "$name" >"$BIN/$name.sha256"
}

build() {
  local t0 entry
  t0=$(date +%s)
  log "unit tests (go test also runs go vet's core checks) ..."
  (cd "$SRC" && go test -trimpath -count=1 .)  # -trimpath: shares compiled deps with the build
  for entry in "${STAMPED[@]}"; do
    link "${entry%% *}" "${entry#* }"
  done
  stamp_content >"$STAMP"
  log "built $OUT in $(( $(date +%s) - t0 ))s"
}

verify() {
  local out want entry
  for entry in "${STAMPED[@]:1}"; do
    out=$("$BIN/${entry%% *}" --version) || die "$BIN/${entry%% *} --version failed"
    want="k3s version ${entry#* } ($GIT_COMMIT)"
    [[ $(head -n1 <<<"$out") == "$want" ]] || die "$BIN/${entry%% *} reports '$(head -n1 <<<"$out")', want '$want'"
    (cd "$BIN" && sha256sum --check --status "${entry%% *}.sha256") || die "${entry%% *}.sha256 does not match"
  done
  out=$("$OUT" --version) || die "$OUT --version failed"
  want="k3s version $K3S_VERSION ($GIT_COMMIT)"
  [[ $(head -n1 <<<"$out") == "$want" ]] || die "$OUT reports '$(head -n1 <<<"$out")', want '$want'"
  [[ $(sed -n 2p <<<"$out") == "go version $GO_VERSION" ]] || die "$OUT reports '$(sed -n 2p <<<"$out")'"
  if command -v readelf >/dev/null && readelf -l "$OUT" 2>/dev/null | grep -q 'program interpreter'; then
    die "$OUT is dynamically linked"
  fi
  (cd "$BIN" && sha256sum --check --status "$SUMFILE") || die "$SUMFILE does not match $OUT"
  log "$(head -n1 <<<"$out"), static, sha256 $(cut -c1-16 "$SUMFILE")..."
}

log "cache $CACHE; k3s $K3S_VERSION (k8s.io modules $STAGING_VERSION); $GO_VERSION; sources $GIT_COMMIT"
if [[ $FORCE -eq 0 ]] && up_to_date; then
  log "$OUT matches the sources and pins; nothing to build"
else
  rm -f "$STAMP"
  build
fi
verify
log "all done in $(( $(date +%s) - START_ALL ))s"
