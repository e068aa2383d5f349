#!/usr/bin/env bash
# Build the real Pulumi Kubernetes provider plugin, pulumi-resource-kubernetes, from the Go
# module proxy and install it into the lab's plugin cache, outside the repository:
#
#   "$HK3S_LAB_CACHE/pulumi-home/plugins/resource-kubernetes-v<SDK>/pulumi-resource-kubernetes"
#
# where <SDK> is the pulumi-kubernetes version requirements.txt pins (the Python SDK asks the
# engine for that version). Lab stacks (lab/stack_harness.py) see every plugin of that cache in
# their own PULUMI_HOME.
#
# The provider that runs is NOT the pinned one: the proxy serves the provider module
# github.com/pulumi/pulumi-kubernetes/provider/v4 at one pseudo-version only (below), the
# commit released as v4.25.0. Its go.mod replaces sdk/v4 with ../sdk, a folder the module zip
# lacks, so the build runs in a writable copy of the module with that replace dropped and
# sdk/v4 required at v4.25.0 (its Go code differs from v4.24.x in version strings only).
# main.go embeds schema-embed.json and terraform-mapping-embed.json, which the zip lacks too:
# its generate.go writes them from schema.json and terraform-mapping.json (VERSION=4.25.0).
# The binary reports 4.25.0 (-ldflags -X .../pkg/version.Version) and is registered under the
# pinned SDK version; the engine warns once per run that it "has 4.25.0".
#
# Built without the provider's component resources (yaml/v2 ConfigFile and ConfigGroup, helm.sh/v4
# Chart, kustomize/v2 Directory): lab/build/k8s_provider/provider_construct.go replaces the file
# that registers them. They import the provider's whole Go SDK (every API group's generated types),
# about half of the plugin's cold compile; the program uses none of them (Longhorn is a helm.sh/v3
# Release, a custom resource), and every custom resource stays upstream's code. A Construct of any
# type is refused with "unknown resource type", as upstream refuses a type it does not serve.
#
# Cost, cold (an empty Go build cache, 2 cores): 334 CPU-seconds, 176 s, 1.2 GB peak memory; with the
# component resources it was 876 CPU-seconds, 614 s and 4.0 GB (2026-12-06). Idempotent:
# a stamp records the pins, the Go version and this script's recipe; when it matches and the
# plugin is installed, nothing is built.
#
# Usage: lab/build/k8s_provider.sh            build and install if needed
#        lab/build/k8s_provider.sh --force    rebuild even when the stamp matches
set -euo pipefail
# shellcheck source=lab/build/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# ---- pins -------------------------------------------------------------------------
readonly PROVIDER_MODULE="github.com/pulumi/pulumi-kubernetes/provider/v4"
readonly PROVIDER_PSEUDO_VERSION="v4.0.0-20260115033456-f47bc2d6f199"
readonly SDK_MODULE="github.com/pulumi/pulumi-kubernetes/sdk/v4"
readonly PROVIDER_VERSION="4.25.0"
# Bump when the build recipe (flags, layout) changes so the cached plugin is redone.
readonly RECIPE=2

readonly REQUIREMENTS="$HERE/../../requirements.txt"
SDK_VERSION=$(sed -n 's/^pulumi-kubernetes==\([0-9][0-9.]*\)[[:space:]]*$/\1/p' "$REQUIREMENTS")
[[ -n $SDK_VERSION ]] || die "requirements.txt pins no pulumi-kubernetes==X.Y.Z"
readonly SDK_VERSION
readonly SRC="$CACHE/src/k8s-provider"
readonly PULUMI_HOME_DIR="$CACHE/pulumi-home"
readonly PLUGIN_DIR="$PULUMI_HOME_DIR/plugins/resource-kubernetes-v$SDK_VERSION"
readonly PLUGIN="$PLUGIN_DIR/pulumi-resource-kubernetes"
readonly STAMP="$BIN/.k8s-provider-stamp"
readonly VERSION_VAR="$PROVIDER_MODULE/pkg/version.Version"

case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

[[ -x $BIN/pulumi ]] || die "no Pulumi CLI at $BIN/pulumi: run lab/build/pulumi.sh first"
# -modcacherw: module cache files stay writable, so the cache dir can simply be deleted.
go_environment "-buildvcs=false -modcacherw" unoptimized

stamp_content() {
  printf 'provider=%s@%s\nsdk-go=%s\nversion=%s\nregistered-as=%s\ngo=%s\nrecipe=%s\nconstruct=%s\n' \
    "$PROVIDER_MODULE" "$PROVIDER_PSEUDO_VERSION" "$PROVIDER_VERSION" "$PROVIDER_VERSION" \
    "$SDK_VERSION" "$GO_VERSION" "$RECIPE" "$(sha256sum <"$HERE/k8s_provider/provider_construct.go" | cut -c1-16)"
}

mkdir -p "$BIN"
lock_build k8s-provider

# A writable copy of the provider module, ready to build: the sdk replace dropped, sdk/v4
# required at the released version, the embedded schema generated.
prepare_source() {
  local info dir
  info=$(go -C "$CACHE" mod download -json "$PROVIDER_MODULE@$PROVIDER_PSEUDO_VERSION") \
    || die "cannot download $PROVIDER_MODULE@$PROVIDER_PSEUDO_VERSION from $GOPROXY"
  dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")
  [[ -d $dir ]] || die "no module directory in: $info"
  rm -rf "$SRC"
  mkdir -p "$(dirname "$SRC")"
  cp -r "$dir" "$SRC"
  chmod -R u+w "$SRC"
  go -C "$SRC" mod edit -dropreplace="$SDK_MODULE" -require="$SDK_MODULE@v$PROVIDER_VERSION"
  go -C "$SRC" mod download "$SDK_MODULE"
  # The component resources left out (see the header): before tidy, so go.sum lists only what is built.
  cp "$HERE/k8s_provider/provider_construct.go" "$SRC/pkg/provider/provider_construct.go"
  # go.sum gains the hashes of sdk/v4 v4.25.0 (and only what it adds): the build stays -mod=readonly.
  go -C "$SRC" mod tidy
  (cd "$SRC/cmd/pulumi-resource-kubernetes" && VERSION=$PROVIDER_VERSION go run ./generate.go)
  [[ -s $SRC/cmd/pulumi-resource-kubernetes/schema-embed.json ]] || die "generate.go wrote no schema-embed.json"
}

build_provider() {
  TMPOUT=$(mktemp "$BIN/.pulumi-resource-kubernetes.XXXXXX")
  go -C "$SRC" build -trimpath -ldflags "-s -w -X $VERSION_VAR=$PROVIDER_VERSION" \
    -o "$TMPOUT" ./cmd/pulumi-resource-kubernetes
  chmod 0755 "$TMPOUT"
}

# Into the lab's plugin cache as the pinned SDK's version, the way `pulumi plugin install` does.
install_plugin() {
  rm -rf "$PLUGIN_DIR" "$PLUGIN_DIR.partial" "$PLUGIN_DIR.lock"
  PULUMI_HOME=$PULUMI_HOME_DIR PULUMI_SKIP_UPDATE_CHECK=true \
    "$BIN/pulumi" plugin install resource kubernetes "$SDK_VERSION" --file "$TMPOUT"
  rm -f "$TMPOUT"
  TMPOUT=""
}

up_to_date() {
  stamp_current "$STAMP" && [[ -x $PLUGIN ]]
}

verify() {
  local listed
  listed=$(PULUMI_HOME=$PULUMI_HOME_DIR PULUMI_SKIP_UPDATE_CHECK=true "$BIN/pulumi" plugin ls) \
    || die "pulumi plugin ls failed"
  grep -Eq "^kubernetes[[:space:]]+resource[[:space:]]+$SDK_VERSION([[:space:]]|$)" <<<"$listed" \
    || die "pulumi plugin ls does not list resource kubernetes $SDK_VERSION: $listed"
  [[ -x $PLUGIN ]] || die "no executable $PLUGIN"
  log "pulumi-resource-kubernetes $PROVIDER_VERSION installed as resource kubernetes $SDK_VERSION in $PULUMI_HOME_DIR"
}

log "cache $CACHE; $PROVIDER_MODULE@$PROVIDER_PSEUDO_VERSION (v$PROVIDER_VERSION) for pulumi-kubernetes==$SDK_VERSION; $GO_VERSION"
if [[ $FORCE -eq 0 ]] && up_to_date; then
  log "$PLUGIN matches the pins; nothing to build (--force rebuilds)"
else
  rm -f "$STAMP"
  timed "prepare the provider module (copy, sdk/v4 v$PROVIDER_VERSION, generate the embedded schema)" prepare_source
  timed "build pulumi-resource-kubernetes $PROVIDER_VERSION" build_provider
  timed "install as resource kubernetes $SDK_VERSION" install_plugin
  stamp_content >"$STAMP"
  for t in "${TIMINGS[@]}"; do log "  $t"; done
fi
verify
log "all done in $(( $(date +%s) - START_ALL ))s"
