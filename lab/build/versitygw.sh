#!/usr/bin/env bash
# Build the lab's real S3 server (LAB ONLY: never shipped) from its Go module:
#
#   versitygw    github.com/versity/versitygw/cmd/versitygw @ VERSITYGW_VERSION (Apache-2.0)
#   -> "$HK3S_LAB_CACHE/bin/versitygw"   static binary (CGO_ENABLED=0)
#
# (HK3S_LAB_CACHE defaults to /var/cache/hk3s-lab.) Its posix backend serves a directory as
# S3, each top-level directory a bucket; lab/s3_server.py starts it for the tests that keep
# Pulumi state in an S3 bucket (Pulumi's DIY backend, s3://...). Only the Go module proxy is
# used; the module has no replace directives, so `go install module/cmd@version` builds it.
#
# Go caches: GOMODCACHE="$HK3S_LAB_CACHE/go/mod", GOCACHE="$HK3S_LAB_CACHE/go/build".
# Idempotent: a stamp next to the binary records the pin, the Go version and the recipe; when
# it matches and the binary is there, nothing is rebuilt. Always smoke-checked: the binary
# must report the pinned version.
#
# Usage: lab/build/versitygw.sh           build if needed, then verify
#        lab/build/versitygw.sh --force   rebuild even when the stamp matches
set -euo pipefail
# shellcheck source=lab/build/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly VERSITYGW_VERSION="v1.8.0"
readonly MODULE="github.com/versity/versitygw"
# Bump when the build recipe (flags, layout) changes so the cached binary is redone.
readonly RECIPE=1
readonly OUT="$BIN/versitygw"
readonly STAMP="$BIN/.versitygw-stamp"

case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

go_environment "-buildvcs=false -modcacherw" unoptimized

stamp_content() {
  printf 'versitygw=%s\ngo=%s\nrecipe=%s\n' "$VERSITYGW_VERSION" "$GO_VERSION" "$RECIPE"
}

# smoke_check FILE: the binary runs and reports the pinned version.
smoke_check() {
  local got
  got=$("$1" --version 2>&1) || die "$1 --version failed: $got"
  [[ $got == *"${VERSITYGW_VERSION#v}"* ]] || die "$1 reports '$got', expected $VERSITYGW_VERSION"
  log "versitygw --version: $(head -n1 <<<"$got")"
}

mkdir -p "$BIN"
lock_build versitygw

if [[ $FORCE -eq 0 && -x $OUT ]] && stamp_current "$STAMP"; then
  log "$OUT matches the pin; nothing to build (--force rebuilds)"
  smoke_check "$OUT"
  exit 0
fi
rm -f "$STAMP"
STAGE=$(mktemp -d "$CACHE/.versitygw-stage.XXXXXX")
build() {
  # The release's version variables, as its own Makefile sets them (main.Version, main.Build).
  GOBIN="$STAGE" go install -trimpath \
    -ldflags "-s -w -X main.Version=$VERSITYGW_VERSION -X main.Build=lab -X main.BuildTime=none" \
    "$MODULE/cmd/versitygw@$VERSITYGW_VERSION"
}
timed "build versitygw $VERSITYGW_VERSION" build
smoke_check "$STAGE/versitygw"
mv -f "$STAGE/versitygw" "$OUT"
stamp_content >"$STAMP"
log "installed $OUT"
for t in "${TIMINGS[@]}"; do log "  $t"; done
log "timing: total $(( $(date +%s) - START_ALL ))s"
