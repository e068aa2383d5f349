#!/usr/bin/env bash
# CPU cost of building the lab's Kubernetes control-plane binaries two ways (LAB ONLY: a
# benchmark for lab/build/kube.sh's recipe, never part of the set-up):
#   sequential  one `go build` per binary, one after another (kube.sh's recipe before issue 39)
#   shared      one `go build -o DIR/ pkg...` for all four (the compile shared, links in parallel)
# Each run uses its own build cache under WORKDIR, so nothing of the lab's shared cache is
# written: modules are read from the lab's module cache with GOPROXY=off (read only), the
# tools module is a copy of the one kube.sh generated. CPU seconds are the children's
# user + system time (/usr/bin/time), the figure that counts on a shared machine; wall time
# is printed too but depends on what else runs.
#
# Usage: bench/kube_build_cost.sh WORKDIR MODE [cache]
#   MODE sequential|shared; cache: a directory name under WORKDIR holding the build cache
#   (default: an empty one named after MODE, i.e. a cold build). Run under `nice -n 19`.
# Measured (2026-12-05, 2 cores, nice 19, build cache warm from the lab's, so the figures are the
# part the recipes differ in: planning the builds and the links; the compiles are the same union
# of packages either way): sequential 30.0 / 19.0 CPU-s, shared 25.5 / 16.5 CPU-s (a loaded /
# a calmer machine); wall on the calmer machine 19.8 s against 11.0 s. Same bytes both ways.
set -euo pipefail
workdir=${1:?WORKDIR}
mode=${2:?MODE}
cache=${3:-cache-$mode}
lab=${HK3S_LAB_CACHE_READONLY:-/var/cache/hk3s-lab}
version=$(bash "$(dirname "${BASH_SOURCE[0]}")/../lab/build/kube.sh" --print-version)
minor=${version#v1.}
minor=${minor%%.*}

# An output already there with the build's ID would be kept as it is (go build skips a link
# whose target is up to date), so every run links into an empty directory.
rm -rf "$workdir/out-$mode"
mkdir -p "$workdir/$cache" "$workdir/out-$mode"
if [[ ! -f $workdir/kube-tools/go.mod ]]; then
  mkdir -p "$workdir/kube-tools"
  cp "$lab/src/kube-tools/go.mod" "$lab/src/kube-tools/go.sum" "$workdir/kube-tools/"
fi
export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=readonly" GOPROXY=off CGO_ENABLED=0 GOGC=400
export GOMODCACHE="$lab/go/mod" GOCACHE="$workdir/$cache"
date=$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/$version.info")
flags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  flags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=archive -X $pkg.buildDate=$date"
done
names=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
out=$workdir/out-$mode
cd "$workdir/kube-tools"
build() { go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$flags" "$@"; }
export -f build
export flags
# The loop's variables expand in the inner shell, not here:
# shellcheck disable=SC2016
case $mode in
  sequential)
    script='for n in '"${names[*]}"'; do build -o "'"$out"'/$n" "k8s.io/kubernetes/cmd/$n"; done' ;;
  shared)
    script='build -o "'"$out"'/" '"${names[*]/#/k8s.io/kubernetes/cmd/}" ;;
  *) echo "MODE: sequential or shared" >&2; exit 2 ;;
esac
/usr/bin/time -f "$mode cache=$cache user=%U system=%S wall=%e maxrss_kb=%M" bash -c "$script"
sha256sum "$out"/* | sed "s|$out/||"
