# Sourced by the lab's build scripts (lab/build/*.sh), not run: what each of them needs
# before it builds anything.
#
#   CACHE, BIN          the lab cache ($HK3S_LAB_CACHE, default /var/cache/hk3s-lab) and its bin/
#   HERE                lab/build
#   log MSG / die MSG   "[<script> HH:MM:SS] MSG" on stdout / on stderr, then exit 1
#   timed LABEL CMD...  run CMD, log how long it took and keep it in TIMINGS
#   TMPOUT, STAGE       a half-written file / directory, removed when the script exits; a
#                       script that fails says so with its run time
#   go_environment GOFLAGS [unoptimized]
#                       Go's module and build caches inside the lab cache (an empty cache is
#                       a truly cold build), static binaries, no DWARF compiled, no toolchain download unless
#                       HK3S_GOTOOLCHAIN asks for one, the Go tools' GOGC at 400; sets GO_VERSION.
#                       "unoptimized": the compiler neither optimizes nor inlines (-N -l), for
#                       the lab's tools whose run time in the tests is small next to their build
#   lock_build NAME     one run of a build at a time ($CACHE/.NAME.lock)
#   stamp_current FILE  FILE holds what the script's stamp_content prints now: its inputs
#                       (sources, pins, Go version, recipe) have not changed since the build
# shellcheck shell=bash
# The variables set here are read by the sourcing script:
# shellcheck disable=SC2034

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
readonly CACHE="${HK3S_LAB_CACHE:-/var/cache/hk3s-lab}"
readonly BIN="$CACHE/bin"
BUILD_SCRIPT=$(basename "${BASH_SOURCE[1]}")
readonly BUILD_SCRIPT
START_ALL=$(date +%s)
readonly START_ALL
FORCE=0

log() { printf '[%s %s] %s\n' "$BUILD_SCRIPT" "$(date +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

TIMINGS=()
# timed LABEL CMD...: a failure of CMD ends the script through set -e; the EXIT trap reports it.
timed() {
  local label=$1 t0 dt
  shift
  t0=$(date +%s)
  log "$label ..."
  "$@"
  dt=$(( $(date +%s) - t0 ))
  TIMINGS+=("$label: ${dt}s")
  log "$label done in ${dt}s"
}

TMPOUT=""
STAGE=""
on_exit() {
  local rc=$?
  [[ -z $TMPOUT ]] || rm -f "$TMPOUT"
  [[ -z $STAGE ]] || rm -rf "$STAGE"
  if [[ $rc -ne 0 ]]; then
    log "FAILED (exit $rc) after $(( $(date +%s) - START_ALL ))s" >&2
  fi
}
trap on_exit EXIT

go_environment() {
  command -v go >/dev/null || die "go is not installed"
  # Never fetch another toolchain behind our back: a pin that needs a newer Go fails loudly
  # (set HK3S_GOTOOLCHAIN, e.g. go1.27.3, to let the go command fetch that one).
  export GOTOOLCHAIN="${HK3S_GOTOOLCHAIN:-local}"
  # The compiler writes no DWARF: every binary is linked with -ldflags "-s -w", which drops it
  # anyway, so it was work for nothing (kube-scheduler from an empty build cache: 329 CPU-seconds
  # against 370-378 on 2 cores). Panics still print their stacks (those come from the pclntab).
  # No stamp includes it: binaries already built stay valid.
  local gcflags="-dwarf=false"
  # Without optimization and inlining the compiler does about a third less work (kine from an
  # empty build cache: 209 CPU-seconds against 290 on 2 cores) and the binary runs slower. Only
  # the builds whose binaries do little in the tests ask for it (the Kubernetes and hcloud
  # provider plugins, the S3 server), and they share few packages with the optimized builds.
  # Behaviour is the same code's. No stamp includes it: binaries already built stay valid.
  if [ "${2:-}" = unoptimized ]; then
    gcflags="$gcflags -N -l"
  fi
  export GOFLAGS="$1 '-gcflags=all=$gcflags'"
  export GOMODCACHE="$CACHE/go/mod"
  export GOCACHE="$CACHE/go/build"
  export CGO_ENABLED=0  # static binaries: they run inside the lab's Debian hosts
  # The compiler and linker collect garbage less often: Kubernetes' and Pulumi's big
  # packages then compile about a fifth faster (kube-scheduler from an empty build cache:
  # 225 s against 276 s on 2 cores, one run each) for more memory, which the lab's machines have.
  # No stamp includes it: binaries already built stay valid.
  export GOGC="${GOGC:-400}"
  export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
  GO_VERSION=$(go env GOVERSION)
  readonly GO_VERSION
}

lock_build() {
  local lock="$CACHE/.$1.lock"
  mkdir -p "$CACHE"
  exec 9>"$lock"
  if ! flock -n 9; then
    log "another $BUILD_SCRIPT holds $lock; waiting"
    flock 9
  fi
}

stamp_current() {
  [[ -f $1 && "$(cat "$1")" == "$(stamp_content)" ]]
}
