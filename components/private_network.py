"""PrivateNetwork: the Hetzner Cloud network the program's servers share."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_hcloud as hcloud

from components.hetzner_project import hetzner_name, ownership_labels
from providers.network_ranges import NetworkRanges


@dataclass(frozen=True)
class PrivateNetworkArgs:
    """Arguments of `PrivateNetwork`."""

    cluster_name: str
    """Prefix of the network's name."""
    ip_range: str
    """The whole network (hk3s:network.private_network_cidr)."""
    subnet_range: str
    """The subnet servers are attached to (hk3s:network.private_subnet_cidr)."""
    network_zone: str
    """Hetzner network zone of the server's location (one network spans one zone)."""
    protect: bool = True
    """Protect the network and subnet from deletion (hk3s:cluster.protect_control_plane): Pulumi's
    `protect` on both, and Hetzner's delete protection on the network (a subnet has none)."""


class PrivateNetwork(pulumi.ComponentResource):
    """Hetzner network, its cloud subnet, and one attachment per server."""

    network_id: pulumi.Output[str]
    subnet_id: pulumi.Output[str]
    ip_range: pulumi.Output[str]

    def __init__(self, name: str, args: PrivateNetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("hk3s:index:PrivateNetwork", name, None, opts)
        self._protect = args.protect
        # Ranges are fixed once the network exists: a change is refused at preview (NetworkRanges)
        # and never reaches Hetzner, which would replace the network and every attachment.
        ranges = NetworkRanges(
            f"{name}-ranges",
            network_range=args.ip_range,
            subnet_range=args.subnet_range,
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect),
        )
        child = pulumi.ResourceOptions(parent=self, protect=args.protect, depends_on=[ranges])
        self._network = hcloud.Network(
            f"{name}-network",
            name=hetzner_name(args.cluster_name, pulumi.get_stack(), "network"),
            ip_range=args.ip_range,
            labels=ownership_labels(args.cluster_name, pulumi.get_stack()),
            # Hetzner's lock, which also stops a delete in the Cloud Console or the hcloud CLI; lifted
            # with `protect` by the teardown's `up`.
            delete_protection=args.protect,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(ignore_changes=["ip_range"])),
        )
        self._subnet = hcloud.NetworkSubnet(
            f"{name}-subnet",
            network_id=self._network.id.apply(int),
            type="cloud",
            network_zone=args.network_zone,
            ip_range=args.subnet_range,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(ignore_changes=["ip_range", "network_zone"])
            ),
        )
        self.network_id = self._network.id
        self.subnet_id = self._subnet.id
        self.ip_range = self._network.ip_range
        self.register_outputs({"network_id": self.network_id, "subnet_id": self.subnet_id, "ip_range": self.ip_range})

    def attach(self, node: str, server_id: pulumi.Output[str], control_plane: bool = False) -> hcloud.ServerNetwork:
        """Attach a server to the subnet; the attachment's `ip` is its private address. The control
        plane's attachment is protected with the network."""
        return hcloud.ServerNetwork(
            f"{node}-private",
            server_id=server_id.apply(int),
            subnet_id=self._subnet.id,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self._subnet], protect=control_plane and self._protect
            ),
        )
