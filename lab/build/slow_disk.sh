#!/usr/bin/env bash
# Build the lab's slow disk (lab/slow_disk_fs, LAB ONLY: never shipped): a FUSE
# passthrough filesystem whose fsync/fdatasync wait as long as a control file says,
# mounted by lab/slow_disk.py for hosts with HostSpec(disk_sync_delay_ms=...).
#   -> "$HK3S_LAB_CACHE/bin/slow-disk-fs"   static binary (CGO_ENABLED=0)
# (HK3S_LAB_CACHE defaults to /var/cache/hk3s-lab). Only the Go module proxy is used.
#
# Idempotent: a stamp next to the binary records a hash of the sources (go.mod,
# go.sum, non-test *.go, this script and common.sh) and the Go version; when it matches and the
# binary is there, nothing is rebuilt. A build first runs the Go unit tests.
#
# Usage: lab/build/slow_disk.sh           build if needed
#        lab/build/slow_disk.sh --force   rebuild even when the stamp matches
set -euo pipefail
# shellcheck source=lab/build/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly SRC="$HERE/../slow_disk_fs"
readonly OUT="$BIN/slow-disk-fs"
readonly STAMP="$BIN/.slow-disk-fs-stamp"

case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

[[ -f $SRC/go.mod ]] || die "no Go module at $SRC"
go_environment "-buildvcs=false -mod=readonly"

source_hash() {
  (
    cd "$SRC"
    find . -maxdepth 1 -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) ! -name '*_test.go' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
    sha256sum <"$HERE/slow_disk.sh"
    sha256sum <"$HERE/common.sh"
  ) | sha256sum | cut -c1-64
}

stamp_content() {
  printf 'source=%s\ngo=%s\n' "$(source_hash)" "$GO_VERSION"
}

mkdir -p "$BIN"
lock_build slow-disk-fs

if [[ $FORCE -eq 0 && -x $OUT ]] && stamp_current "$STAMP"; then
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
