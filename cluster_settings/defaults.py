"""Defaults and bounds of settings that providers also read. A module of its own, free of
pydantic, so that a provider process checking these values does not build the settings models."""

from __future__ import annotations

# hk3s:storage.disk_sync_p99_ms: etcd's guidance for its WAL's fdatasync, and the range accepted.
DISK_SYNC_P99_DEFAULT_MS = 10.0
DISK_SYNC_P99_MIN_MS = 0.5
DISK_SYNC_P99_MAX_MS = 1000.0

# hk3s:cluster.validation_image: the busybox k3s's own air-gap image tarball carries (see
# ClusterSettings.validation_image).
VALIDATION_IMAGE_DEFAULT = "docker.io/rancher/mirrored-library-busybox:1.36.1"
