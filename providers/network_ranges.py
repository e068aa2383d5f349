"""NetworkRanges: the private network's and subnet's ranges, fixed once the network exists.

Hetzner replaces a network (and so every server's attachment) whose range changes, and
the nodes' private addresses would change under k3s. The Hetzner resources ignore such
a change; this record makes `preview` refuse it, naming the setting, as the fixed
network mode is refused. It touches no host and no API.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from providers.inputs import ResourceInputs, checkable


@dataclasses.dataclass(frozen=True, kw_only=True)
class NetworkRangesInputs(ResourceInputs):
    """The private network's and its subnet's ranges."""

    network_range: str
    subnet_range: str


# Input -> the setting it comes from.
FIXED_RANGES = dict(
    zip(
        NetworkRangesInputs.names("network_range", "subnet_range"),
        ("hk3s:network.private_network_cidr", "hk3s:network.private_subnet_cidr"),
        strict=True,
    )
)


def range_change_problems(olds: dict[str, Any], news: dict[str, Any]) -> list[CheckFailure]:
    """A failure for each range that differs from the one the network was created with."""
    failures = []
    for key, setting in FIXED_RANGES.items():
        old, new = olds.get(key), checkable(news, key)
        if isinstance(old, str) and isinstance(new, str) and old != new:
            failures.append(
                CheckFailure(
                    key,
                    f"{setting} was {old} when the private network was created and cannot change to {new}: "
                    "Hetzner would replace the network and every server's attachment, changing the nodes' "
                    f"private addresses under k3s. Set {setting} back to {old}",
                )
            )
    return failures


class NetworkRangesProvider(ResourceProvider):
    """Dynamic provider of `NetworkRanges`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, range_change_problems(olds, news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [key for key in FIXED_RANGES if olds.get(key) != news.get(key)]
        return DiffResult(changes=bool(changed), replaces=[], delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_="network-ranges", outs=props)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=news)


class NetworkRanges(Resource, module="hk3s", name="NetworkRanges"):
    """The ranges the private network was created with."""

    def __init__(
        self, resource_name: str, network_range: str, subnet_range: str, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        inputs = NetworkRangesInputs(network_range=network_range, subnet_range=subnet_range)
        super().__init__(NetworkRangesProvider(), resource_name, inputs.props(), opts)
