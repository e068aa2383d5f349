#!/usr/bin/env bash
# Build the container runtime that pod-capable lab hosts run under the k3s stand-in
# (LAB ONLY: never shipped; real k3s bundles the same parts in its binary):
#   runc                         (github.com/opencontainers/runc; cgo + libseccomp, static)
#   containerd, containerd-shim-runc-v2, ctr   (github.com/containerd/containerd/v2)
#   crictl                       (sigs.k8s.io/cri-tools)
#   kubelets/<k3s version>/kubelet   one per k3s release the lab's stand-in ships
#                                 (lab/build/k3s_standin.sh --print-releases: k3s, k3s-patch,
#                                 k3s-minor), k8s.io/kubernetes at lab/build/kube.sh's release
#                                 built in kube.sh's tools module and stamped with that k3s
#                                 version: k3s embeds its kubelet, so a Node reports the k3s
#                                 binary's own version, and the stand-in runs its release's
#                                 kubelet. The compiled packages are the same for every
#                                 release (only the linker's -X version flags differ), so each
#                                 release after the first costs a link, not a build
#   longhorn-csi-plugin          (lab/longhorn_standin/csi: the lab's stand-in for Longhorn's CSI
#                                 node plugin, built in the same tools module, whose go.sum
#                                 already holds the CSI spec, gRPC and the kubelet's plugin
#                                 registration API: no module is fetched for it)
#     -> "$HK3S_LAB_CACHE/bin"
#   bridge, host-local, loopback, portmap CNI plugins (github.com/containernetworking/plugins)
#     -> "$HK3S_LAB_CACHE/cni/bin"
#   the pause image (the Kubernetes pause source from the k8s.io/kubernetes module that
#   lab/build/kube.sh pins, built with gcc -static) and a small test image (Debian's
#   busybox-static), as docker-archive tarballs named as k3s's air-gap images name them
#     -> "$HK3S_LAB_CACHE/images/*.tar"
#
# Only the Go module proxy and Debian's packages are used: no registry, release
# download or git. Each part has its own stamp (its pin, Go version and recipe) in
# "$HK3S_LAB_CACHE/pods/"; a part whose stamp matches and whose outputs exist is
# skipped, so a changed pin rebuilds only that part. Every output is smoke-checked.
#
# Usage: lab/build/pod_runtime.sh            build what is missing, then verify
#        lab/build/pod_runtime.sh --force    rebuild every part
#        lab/build/pod_runtime.sh --print-images   print "file image-name" per image
# Environment: HK3S_LAB_CACHE (cache dir), HK3S_GOTOOLCHAIN (default "local"), GOPROXY.
set -euo pipefail
# shellcheck source=lab/build/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# ---- pins -------------------------------------------------------------------------
readonly RUNC_VERSION="v1.5.3"
readonly CONTAINERD_VERSION="v2.4.2"
readonly CNI_PLUGINS_VERSION="v1.10.0"
readonly CRICTL_VERSION="v1.37.0"
# Image names k3s's air-gap image tarball uses: the sandbox image k3s pins, and the
# busybox that k3s's bundled local-path provisioner runs (so an air-gapped k3s node has
# it too). The lab's busybox is Debian's busybox-static under that name.
readonly PAUSE_IMAGE="docker.io/rancher/mirrored-pause:3.6"
readonly BUSYBOX_IMAGE="docker.io/rancher/mirrored-library-busybox:1.36.1"
# Bump when a part's recipe (flags, tags, layout) changes so it is redone.
readonly RECIPE=1

readonly CNI_BIN="$CACHE/cni/bin"
readonly IMAGES="$CACHE/images"
readonly STAMPS="$CACHE/pods"
readonly CNI_PLUGINS=(bridge host-local loopback portmap)
CSI_SOURCE="$(cd "$HERE/../longhorn_standin/csi" && pwd)/main.go"
readonly CSI_SOURCE

case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  --print-images)
    printf 'pause.tar %s\nbusybox.tar %s\n' "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"
    exit 0
    ;;
  -h|--help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
  *) echo "usage: $0 [--force|--print-images]" >&2; exit 2 ;;
esac

go_environment "-buildvcs=false"
KUBE_VERSION=$(bash "$HERE/kube.sh" --print-version)
readonly KUBE_VERSION
# The k3s releases the stand-in is stamped with; each gets its own kubelet.
mapfile -t RELEASES < <(bash "$HERE/k3s_standin.sh" --print-releases | cut -d' ' -f2)
[[ ${#RELEASES[@]} -gt 0 ]] || die "lab/build/k3s_standin.sh --print-releases listed no release"
readonly RELEASES
readonly KUBELETS="$BIN/kubelets"

mkdir -p "$BIN" "$CNI_BIN" "$IMAGES" "$STAMPS"
lock_build pod-runtime
STAGE=$(mktemp -d "$CACHE/build-pods.XXXXXX")

# part NAME PIN OUTPUT... : true when NAME must be (re)built.
needs_build() {
  local name=$1 pin=$2 out
  shift 2
  [[ $FORCE -eq 0 ]] || return 0
  [[ -f $STAMPS/$name && "$(cat "$STAMPS/$name")" == "$(stamp "$pin")" ]] || return 0
  for out in "$@"; do [[ -e $out ]] || return 0; done
  return 1
}
stamp() { printf 'pin=%s\ngo=%s\nrecipe=%s\n' "$1" "$GO_VERSION" "$RECIPE"; }

# step NAME PIN BUILD_FUNCTION OUTPUT...: build into $STAGE, then move the outputs in.
step() {
  local name=$1 pin=$2 fn=$3 t0 out
  shift 3
  if ! needs_build "$name" "$pin" "$@"; then
    log "$name $pin: cached"
    return
  fi
  t0=$(date +%s)
  log "$name $pin: building ..."
  rm -f "$STAMPS/$name"
  mkdir -p "$STAGE/$name"
  "$fn" "$STAGE/$name"
  for out in "$@"; do
    [[ -e $STAGE/$name/${out##*/} ]] || die "$name build produced no ${out##*/}"
    mkdir -p "${out%/*}"
    mv -f "$STAGE/$name/${out##*/}" "$out"
  done
  stamp "$pin" >"$STAMPS/$name"
  log "$name $pin: built in $(( $(date +%s) - t0 ))s"
}

# ---- parts ------------------------------------------------------------------------
build_runc() {
  # runc needs cgo for its seccomp filter; libseccomp.a comes from Debian's
  # libseccomp-dev. Without the libpathrs tag it needs no Rust library.
  [[ -f /usr/lib/x86_64-linux-gnu/libseccomp.a ]] || die "libseccomp.a missing: install libseccomp-dev (scripts/setup_system.sh --lab)"
  CGO_ENABLED=1 GOBIN="$1" go install -trimpath -tags "seccomp netgo osusergo" \
    -ldflags "-s -w -linkmode external -extldflags -static -X main.version=${RUNC_VERSION#v} -X main.gitCommit=module" \
    "github.com/opencontainers/runc@$RUNC_VERSION"
}

build_containerd() {
  local pkg=github.com/containerd/containerd/v2
  GOBIN="$1" go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X $pkg/version.Version=$CONTAINERD_VERSION -X $pkg/version.Revision=module" \
    "$pkg/cmd/containerd@$CONTAINERD_VERSION" \
    "$pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "$pkg/cmd/ctr@$CONTAINERD_VERSION"
}

build_cni() {
  local pkg=github.com/containernetworking/plugins
  GOBIN="$1" go install -trimpath \
    -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
    "$pkg/plugins/main/bridge@$CNI_PLUGINS_VERSION" \
    "$pkg/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
    "$pkg/plugins/main/loopback@$CNI_PLUGINS_VERSION" \
    "$pkg/plugins/meta/portmap@$CNI_PLUGINS_VERSION"
}

# build_kubelet OUT: the kubelet stamped as the k3s release $RELEASE (v1.X.Y+k3s1), as the
# kubelet k3s embeds reports it: gitVersion the k3s version, gitMinor its minor.
build_kubelet() {
  local tools="$CACHE/src/kube-tools" date pkg flags="-s -w" minor=${RELEASE#v1.}
  minor=${minor%%.*}
  if ! grep -qs 'k8s.io/kubernetes/cmd/kubelet' "$tools/go.mod"; then
    die "no kube-tools module with the kubelet in $tools: run lab/build/kube.sh first"
  fi
  date=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"Time": "\(.*\)",\{0,1\}$/\1/p')
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$RELEASE -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=archive -X $pkg.buildDate=${date:-1970-01-01T00:00:00Z}"
  done
  (cd "$tools" && go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$flags" -o "$1/kubelet" k8s.io/kubernetes/cmd/kubelet)
}

# The stand-in's source is copied into a package of the tools module for the build and taken
# out again, so kube.sh's module stays as it generated it.
build_csi_plugin() {
  local tools="$CACHE/src/kube-tools" pkg="longhorn-csi-plugin"
  grep -qs 'k8s.io/kubelet ' "$tools/go.mod" || die "no kube-tools module with the kubelet in $tools: run lab/build/kube.sh first"
  rm -rf "${tools:?}/$pkg"
  mkdir -p "$tools/$pkg"
  cp "$CSI_SOURCE" "$tools/$pkg/main.go"
  (cd "$tools" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$1/longhorn-csi-plugin" "./$pkg") || { rm -rf "${tools:?}/$pkg"; return 1; }
  rm -rf "${tools:?}/$pkg"
}

build_crictl() {
  GOBIN="$1" go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
}

# docker_archive OUT NAME ROOTFS CMD_JSON: a one-layer docker-archive tarball (what
# `ctr images import` and k3s's air-gap folder accept) of ROOTFS tagged NAME.
docker_archive() {
  local out=$1 name=$2 rootfs=$3 cmd=$4 work layer_sum config config_sum
  work=$(mktemp -d "$STAGE/image.XXXXXX")
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$work/layer.tar" .
  layer_sum=$(sha256sum "$work/layer.tar" | cut -c1-64)
  mkdir "$work/$layer_sum"
  mv "$work/layer.tar" "$work/$layer_sum/layer.tar"
  config=$(printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$cmd" "$layer_sum")
  config_sum=$(printf '%s' "$config" | sha256sum | cut -c1-64)
  printf '%s' "$config" >"$work/$config_sum.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$config_sum" "$name" "$layer_sum" >"$work/manifest.json"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out" manifest.json "$config_sum.json" "$layer_sum"
  rm -rf "$work"
}

build_images() {
  local out=$1 kdir rootfs applet
  command -v gcc >/dev/null || die "gcc is not installed"
  if ! /bin/busybox --list >/dev/null 2>&1; then die "busybox-static missing (scripts/setup_system.sh --lab)"; fi
  ldd /bin/busybox >/dev/null 2>&1 && die "/bin/busybox is not the static build (install busybox-static)"
  kdir=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  [[ -f $kdir/build/pause/linux/pause.c ]] || die "no build/pause/linux/pause.c in k8s.io/kubernetes@$KUBE_VERSION"
  rootfs="$STAGE/pause-root"
  mkdir -p "$rootfs"
  gcc -Os -Wall -Werror -static -DVERSION="${PAUSE_IMAGE##*:}-lab" -o "$rootfs/pause" "$kdir/build/pause/linux/pause.c"
  docker_archive "$out/pause.tar" "$PAUSE_IMAGE" "$rootfs" '["/pause"]'
  rootfs="$STAGE/busybox-root"
  mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
  cp /bin/busybox "$rootfs/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [[ $applet == busybox ]] || ln -s busybox "$rootfs/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  docker_archive "$out/busybox.tar" "$BUSYBOX_IMAGE" "$rootfs" '["sh"]'
}

# ---- verification -----------------------------------------------------------------
static_or_die() {
  if readelf -l "$1" 2>/dev/null | grep -q 'program interpreter'; then die "$1 is dynamically linked"; fi
}

verify() {
  local out b
  out=$("$BIN/runc" --version)
  out=${out%%$'\n'*}
  [[ $out == "runc version ${RUNC_VERSION#v}" ]] || die "runc reports '$out'"
  out=$("$BIN/containerd" --version)
  [[ $out == *" $CONTAINERD_VERSION "* ]] || die "containerd reports '$out'"
  out=$("$BIN/ctr" --version)
  [[ $out == *"$CONTAINERD_VERSION"* ]] || die "ctr reports '$out'"
  "$BIN/containerd-shim-runc-v2" -v >/dev/null || die "containerd-shim-runc-v2 -v failed"
  out=$("$BIN/crictl" --version)
  [[ $out == *"${CRICTL_VERSION#v}"* ]] || die "crictl reports '$out'"
  for b in "${RELEASES[@]}"; do
    out=$("$KUBELETS/$b/kubelet" --version)
    [[ $out == "Kubernetes $b" ]] || die "$KUBELETS/$b/kubelet reports '$out', want Kubernetes $b"
    static_or_die "$KUBELETS/$b/kubelet"
  done
  out=$("$BIN/longhorn-csi-plugin" --version)
  [[ $out == "longhorn-csi-plugin (lab stand-in) driver.longhorn.io "* ]] || die "longhorn-csi-plugin reports '$out'"
  for b in runc containerd containerd-shim-runc-v2 ctr crictl longhorn-csi-plugin; do static_or_die "$BIN/$b"; done
  for b in "${CNI_PLUGINS[@]}"; do
    static_or_die "$CNI_BIN/$b"
    [[ $(CNI_COMMAND=VERSION "$CNI_BIN/$b" </dev/null) == *cniVersion* ]] || die "CNI plugin $b does not answer VERSION"
  done
  for b in pause busybox; do
    tar -tf "$IMAGES/$b.tar" manifest.json >/dev/null || die "$IMAGES/$b.tar is not an image archive"
  done
  log "kubelets ${RELEASES[*]} (Kubernetes $KUBE_VERSION), the lab's Longhorn CSI node plugin, runc ${RUNC_VERSION}, containerd $CONTAINERD_VERSION, crictl $CRICTL_VERSION, CNI plugins $CNI_PLUGINS_VERSION (${CNI_PLUGINS[*]}), images $PAUSE_IMAGE $BUSYBOX_IMAGE: static, answering"
}

# ---- main -------------------------------------------------------------------------
log "cache $CACHE; runc $RUNC_VERSION, containerd $CONTAINERD_VERSION, CNI plugins $CNI_PLUGINS_VERSION, crictl $CRICTL_VERSION; $GO_VERSION"
step runc "$RUNC_VERSION" build_runc "$BIN/runc"
step containerd "$CONTAINERD_VERSION" build_containerd "$BIN/containerd" "$BIN/containerd-shim-runc-v2" "$BIN/ctr"
step cni-plugins "$CNI_PLUGINS_VERSION" build_cni "${CNI_PLUGINS[@]/#/$CNI_BIN/}"
step crictl "$CRICTL_VERSION" build_crictl "$BIN/crictl"
for RELEASE in "${RELEASES[@]}"; do
  step "kubelet-$RELEASE" "$RELEASE of $KUBE_VERSION" build_kubelet "$KUBELETS/$RELEASE/kubelet"
done
step longhorn-csi-plugin "$KUBE_VERSION $(sha256sum "$CSI_SOURCE" | cut -c1-16)" build_csi_plugin "$BIN/longhorn-csi-plugin"
step images "$KUBE_VERSION $PAUSE_IMAGE $BUSYBOX_IMAGE $(sha256sum /bin/busybox 2>/dev/null | cut -c1-16)" build_images "$IMAGES/pause.tar" "$IMAGES/busybox.tar"
verify
log "all done in $(( $(date +%s) - START_ALL ))s"
