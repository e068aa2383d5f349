"""CopiesOffer: the number of copies the stack offers (hk3s:storage.max_copies), held against the
volumes that exist. Lowering the offer below what a volume keeps would take its storage class away
while Longhorn goes on keeping its copies, and the operator would believe the cluster now keeps
fewer copies than it does; so a lower offer is refused while any Longhorn volume keeps more copies
than it, naming them, in `check`, which runs at `preview` as at `up` before anything changes.

Longhorn's volumes are read through the server's `k3s kubectl` (node_operations/volume_copies.py's
reading path); the check runs only when the offer goes down on a cluster that exists.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, Resource, UpdateResult

from providers.base import NodeProvider, check_connection_inputs, resource_inputs, run_operation, ssh_target
from providers.inputs import NodeInputs, is_known, known
from remote_access.kube import API_WAIT_SECONDS, ClusterApi, Repeat
from remote_access.ssh import SshError, SshTarget, open_session

MAX_COPIES_KEY = "hk3s:storage.max_copies"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CopiesOfferInputs(NodeInputs):
    """`login` is the server's: Longhorn's volumes are read through its `k3s kubectl`."""

    max_copies: pulumi.Input[int]
    api_wait_seconds: pulumi.Input[float] = API_WAIT_SECONDS


async def volumes_over(server: SshTarget, copies: int, api_wait: float) -> dict[str, int]:
    """Longhorn volumes that keep more than `copies` copies: name -> copies."""
    async with open_session(server) as session:
        out = await ClusterApi(session, api_wait=api_wait).kubectl(
            ["get", "volumes.longhorn.io", "-n", "longhorn-system", "-o", "json"], repeat=Repeat.READ
        )
    found = {}
    for volume in json.loads(out).get("items") or []:
        wanted = int((volume.get("spec") or {}).get("numberOfReplicas") or 0)
        if wanted > copies:
            found[str(volume["metadata"]["name"])] = wanted
    return found


def refusal(copies: int, volumes: dict[str, int]) -> str:
    listed = ", ".join(f"{name} ({wanted} copies)" for name, wanted in sorted(volumes.items()))
    return (
        f"{MAX_COPIES_KEY} cannot go down to {copies} while Longhorn volumes keep more copies: {listed}. "
        f"Nothing was changed. Move their data to volumes of {copies} cop{'y' if copies == 1 else 'ies'} "
        f"(or delete them), then lower {MAX_COPIES_KEY}; or keep it as it is"
    )


class CopiesOfferProvider(NodeProvider):
    """Dynamic provider of `CopiesOffer`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        new, old = news.get("max_copies"), olds.get("max_copies")
        # Numbers reach a dynamic provider as floats.
        if not (isinstance(new, (int, float)) and isinstance(old, (int, float)) and new < old) or not is_known(news):
            return CheckResult(news, failures)
        new = int(new)
        inputs = CopiesOfferInputs.from_props(news)
        try:
            volumes = run_operation(
                volumes_over(ssh_target(inputs.login), new, float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS))
            )
        except SshError as error:
            failures.append(
                CheckFailure(
                    "max_copies",
                    f"{MAX_COPIES_KEY} goes down to {new}, but Longhorn's volumes could "
                    f"not be read to check that none keeps more copies: {error}",
                )
            )
            return CheckResult(news, failures)
        if volumes:
            failures.append(CheckFailure("max_copies", refusal(new, volumes)))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_="copies-offer", outs=props)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=news)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class CopiesOffer(Resource, module="hk3s", name="CopiesOffer"):
    """The copies offered, checked against the volumes that exist."""

    def __init__(
        self, resource_name: str, inputs: CopiesOfferInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(CopiesOfferProvider(), resource_name, resource_inputs(inputs, []), opts)
