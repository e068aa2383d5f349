"""Pulumi program: read the stack's settings, build the cluster, export outputs."""

import pulumi

from cluster_settings import load_settings_from_pulumi
from components.program import build_cluster, read_credentials

settings = load_settings_from_pulumi()
cluster = build_cluster(settings, read_credentials(settings))


def private_address(name: str, configured: pulumi.Output[str | None]) -> pulumi.Output[str | None]:
    """The private address the node uses: its configured one, or in private mode the address its
    peers reach it at (a host given only its public address whose private one was found for it)."""
    network = cluster.server.network
    return pulumi.Output.all(configured, network.mode, cluster.server.cluster_address(name)).apply(
        lambda values: values[0] or (values[2] if values[1] == "private" else None)
    )


pulumi.export("api_endpoint", cluster.server.api_endpoint)
pulumi.export("kubeconfig", cluster.server.kubeconfig)
pulumi.export("k3s_version", cluster.server.version)
pulumi.export("storage_classes", cluster.storage.storage_classes)
pulumi.export(
    "nodes",
    [
        {
            "name": settings.server.name,
            "role": "server",
            "address": cluster.server.endpoint.public_address,
            "private_address": private_address(settings.server.name, cluster.server.endpoint.private_address),
            "ssh_address": cluster.server.endpoint.ssh_address,
            "holds_copies": True,
            "state": "server",
        },
        *(
            {
                "name": spec.name,
                "role": "worker",
                "address": worker.endpoint.public_address,
                "private_address": private_address(spec.name, worker.endpoint.private_address),
                "ssh_address": worker.endpoint.ssh_address,
                "network_mode": worker.network_mode,
                "k3s_version": worker.k3s_version,
                **worker.copies_output(),
                "fenced": spec.name in settings.fences,
                "state": worker.state,
            }
            for spec, worker in zip(settings.all_workers(), cluster.workers, strict=True)
        ),
    ],
)
