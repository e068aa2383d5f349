"""What the k3s stand-in bundles (LAB ONLY): the iptables that real k3s carries inside its binary.

Real k3s extracts its archive (k3s-root) into ``/var/lib/rancher/k3s/data/<hash>/`` at its first
start; ``bin/aux`` there holds iptables, iptables-save, iptables-restore and their ip6tables twins,
which k3s puts at the end of its PATH (cmd/k3s/main.go stageAndRun), so a host without iptables
tools still gets k3s's packet filter rules, and ``k3s-killall.sh`` puts the same folders on its
PATH to remove them. The stand-in (``lab/k3s_standin/bundle.go``) cannot carry an iptables in its
own binary; every lab host gets the base tree's ``xtables-nft-multi`` and its extensions bound
read-only at :data:`BUNDLE_DIR_IN_HOST`, which the stand-in extracts into its data dir as k3s
extracts its archive. Nothing else on the host uses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # lab.hosts imports this module
    from lab.hosts import Host

BUNDLE_DIR_IN_HOST = "/opt/lab-k3s-bundle"
#: Where k3s's extracted bundled tools are on a host (one folder per k3s build).
BUNDLED_AUX_GLOB = "/var/lib/rancher/k3s/data/*/bin/aux"
MULTI_BINARY = "usr/sbin/xtables-nft-multi"


def nspawn_args(base: Path) -> list[str]:
    """systemd-nspawn binds of the base tree's iptables (binary and extensions) at
    BUNDLE_DIR_IN_HOST/aux; none when the base tree has no iptables."""
    extensions = sorted(base.glob("usr/lib/*/xtables"))
    if not (base / MULTI_BINARY).is_file() or not extensions:
        return []
    aux = f"{BUNDLE_DIR_IN_HOST}/aux"
    return [f"--bind-ro={base / MULTI_BINARY}:{aux}/xtables-nft-multi", f"--bind-ro={extensions[0]}:{aux}/xtables"]


def remove_host_iptables(host: Host) -> None:
    """Remove the host's iptables package (its commands and extensions), as on a host installed
    without it; k3s's bundled copy is then the only iptables there."""
    host.run(["dpkg", "--remove", "--force-depends", "iptables"], timeout=120)
    found = host.run(["sh", "-c", "command -v iptables iptables-save ip6tables-save"], check=False).stdout
    assert not found.strip(), f"{host.name} still has iptables tools: {found}"
