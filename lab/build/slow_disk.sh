#!/usr/bin/env bash
# Build the lab's slow disk (lab/slow_disk_fs, LAB ONLY: never shipped): a FUSE
# passthrough filesystem whose fsync/fdatasync wait as long as a control file says,
# mounted by lab/slow_disk.py for hosts with HostSpec(disk_sync_delay_ms=...).
#   -> "$HK3S_LAB_CACHE/bin/slow-disk-fs"   static binary (CGO_ENABLED=0)
# (HK3S_LAB_CACHE defaults to /var/cache/hk3s-lab). Only the Go module proxy is used.
#
# Idempotent: a stamp next to the binary records a hash of the sources (go.mod,
# go.sum, non-test *.go, this script) and the Go version; when it matches and the
# binary is there, nothing is rebuilt. A build first runs the Go unit tests.
#
# Usage: lab/build/slow_disk.sh           build if needed
#        lab/build/slow_disk.sh --force   rebuild even when the stamp matches
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
readonly SRC="$HERE/../slow_disk_fs"
readonly CACHE="${HK3S_LAB_CACHE:-/var/cache/hk3s-lab}"
readonly BIN="$CACHE/bin"
readonly OUT="$BIN/slow-disk-fs"
readonly STAMP="$BIN/.slow-disk-fs-stamp"

FORCE=0
case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

log() { printf '[slow_disk.sh %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }
TMPOUT=""
trap '[[ -z $TMPOUT ]] || rm -f "$TMPOUT"' EXIT

command -v go >/dev/null || die "go is not installed"
[[ -f $SRC/go.mod ]] || die "no Go module at $SRC"
export GOTOOLCHAIN="${HK3S_GOTOOLCHAIN:-local}"
export GOFLAGS="-buildvcs=false -mod=readonly"
# Go's caches live in the lab cache (as the other lab builds'), so an empty HK3S_LAB_CACHE is a cold build.
export GOMODCACHE="$CACHE/go/mod"
export GOCACHE="$CACHE/go/build"
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"

source_hash() {
  (
    cd "$SRC"
    find . -maxdepth 1 -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) ! -name '*_test.go' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
    sha256sum <"$HERE/slow_disk.sh"
  ) | sha256sum | cut -c1-64
}

stamp_content() {
  printf 'source=%s\ngo=%s\n' "$(source_hash)" "$(go env GOVERSION)"
}

mkdir -p "$BIN"
exec 9>"$CACHE/.slow-disk-fs.lock"
flock 9

if [[ $FORCE -eq 0 && -x $OUT && -f $STAMP && "$(cat "$STAMP")" == "$(stamp_content)" ]]; then
  log "$OUT matches the sources; nothing to build"
  exit 0
fi
rm -f "$STAMP"
log "unit tests ..."
(cd "$SRC" && go test -trimpath -count=1 .)
log "go build slow-disk-fs ..."
TMPOUT=$(mktemp "$BIN/.slow-disk-fs.XXXXXX")
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$TMPOUT" .)
chmod 0755 "$TMPOUT"
mv -f "$TMPOUT" "$OUT"
TMPOUT=""
usage=$("$OUT" --help 2>&1 || true)
[[ $usage == *-control* ]] || die "$OUT does not run: $usage"
stamp_content >"$STAMP"
log "built $OUT"
