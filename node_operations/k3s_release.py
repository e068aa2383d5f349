"""How a k3s release is named: `v<major>.<minor>.<patch>+k3s<n>`, as k3s's GitHub releases and
its install script name them. Kept here, at the bottom of the layers, so the settings' checks and
the upgrade's plan read versions the same way."""

from __future__ import annotations

import re

K3S_VERSION = re.compile(r"^v(\d+)\.(\d+)\.(\d+)\+k3s(\d+)$")

#: Kubernetes' version-skew policy: a kubelet may be at most this many minor releases older than
#: its API server (and never newer). k3s runs both at its own release, so the k3s releases compare.
MAX_KUBELET_SKEW = 3


def minors_behind(kubelet: str, server: str) -> int | None:
    """How many minor releases `kubelet` is older than `server` (negative when newer); None when
    either is not a k3s release or their major releases differ."""
    kubelet_match, server_match = K3S_VERSION.match(kubelet), K3S_VERSION.match(server)
    if not kubelet_match or not server_match or kubelet_match[1] != server_match[1]:
        return None
    return int(server_match[2]) - int(kubelet_match[2])


def beyond_skew(kubelet: str, server: str) -> str | None:
    """Why a kubelet at `kubelet` may not run against an API server at `server` (Kubernetes'
    version-skew policy), or None when it may."""
    behind = minors_behind(kubelet, server)
    if behind is None or behind <= MAX_KUBELET_SKEW:
        return None
    return (
        f"k3s {kubelet} is {behind} minor releases older than the server's {server}, and Kubernetes' version-skew "
        f"policy supports a kubelet at most {MAX_KUBELET_SKEW} minor releases older than its API server"
    )
