"""What `pulumi preview` plans for the routine changes of a running stack with Longhorn is what
`pulumi up` then does: no replacement or deletion in the preview that the up does not make.

For new labels and a new API forward port, the preview and the up change the same resources the
same way: the preview announces no update the up then does not make (a resource whose inputs are
unknown only because what it depends on is updated), and the up makes none the preview did not
announce. The other changes update a Python dynamic resource whose outputs others take, and
Pulumi's dynamic provider host has no preview support: those previews still announce updates the
up does not make (docs/changing-things.md lists them).

One cluster (a server and a worker, Longhorn's lab chart, the lab's Longhorn manager stand-in), the
real Pulumi CLI, the real Kubernetes provider plugin and the real engine; nothing is mocked. Each
test makes one change to the stack's config, runs the plain `pulumi preview --json` (as a person
types it, and as `pulumi up` runs first) and then `up`, and compares the preview's steps with the
operations the up's engine events report, resource by resource. The tests run in order, each on
the stack the one before left.

Without a stable identity, a preview of any run that updated the server's k3s (an upgrade, a key
rotation, `teardown: allowed`) planned the Kubernetes provider, and with it Longhorn's namespace,
release and storage classes, as replaced, since the provider's kubeconfig (an output of the
server's k3s) is unknown in that preview; and a new `api_forward_port` really replaced them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto

from lab.hosts import Host, Lab
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    PARALLEL,
    LabStack,
    base_config,
    k3s_release,
    server_spec,
    skip_without_kubernetes_provider,
    skip_without_lab_binaries,
    up_or_fail,
    worker_spec,
)

pytestmark = pytest.mark.lab
STORAGE = {
    "install_longhorn": True,
    "longhorn_chart": str(LONGHORN_STANDIN_CHART),
    "reserved_percent": 5,
    "minimal_available_percent": 5,
}
# The engine's step operations that take a resource away: a replacement in any of its forms, a delete.
REPLACING = {"replace", "create-replacement", "delete-replaced", "discard-replaced", "import-replacement"}
DELETING = {"delete", "discard"}


def removals(operations: dict[str, str]) -> dict[str, str]:
    """The resources (URN -> "replace" or "delete") that the operations take away."""
    out = {}
    for urn, op in operations.items():
        if op in REPLACING:
            out[urn] = "replace"
        elif op in DELETING:
            out[urn] = "delete"
    return out


# A default provider (`pulumi:providers:<package>::default`, or `default_<version>`): the engine's
# own, made for the resources that name no provider. The dynamic provider's takes the stack's config
# as its inputs, so the up reports it updated whenever the config changes, while the plain preview
# plans no step of it. It changes nothing on any host or in the cluster.
DEFAULT_PROVIDER = re.compile(r"::pulumi:providers:[^:]+::default(_[0-9_]+)?$")


def changes(operations: dict[str, str]) -> dict[str, str]:
    """The operations that change a resource (URN -> operation), by resource name: the steps that
    leave a resource as it is ("same", a read) dropped, and a replacement's steps as one; the
    engine's default providers (DEFAULT_PROVIDER) left out."""
    out = {}
    for urn, op in operations.items():
        if op in ("same", "read", "refresh") or DEFAULT_PROVIDER.search(urn):
            continue
        out[urn.rsplit("::", 1)[-1]] = "replace" if op in REPLACING else op
    return out


@dataclass
class Cluster:
    lab: Lab
    stack: LabStack
    server: Host
    w1: Host
    w2: Host
    keys: Path
    config: dict[str, Any] = field(default_factory=dict)

    def write(self, workers: list[Host], **sections: Any) -> None:
        """The stack's config: the lab's base for `workers`, Longhorn, and the sections the tests
        have changed so far (kept from one test to the next)."""
        for key, value in sections.items():
            self.config[key] = {**self.config.get(key, {}), **value}
        config = base_config(self.lab, self.server, workers, storage=STORAGE)
        for key, value in self.config.items():
            if key != "labels":
                config[key] = {**config[key], **value}
        labels = self.config.get("labels", {})
        for worker in config["workers"]:
            if worker["name"] in labels:
                worker["labels"] = labels[worker["name"]]
        self.stack.write_config(config)

    def preview(self) -> dict[str, str]:
        """`pulumi preview --json` as a person runs it: URN -> the planned operation."""
        env = {**os.environ, **self.stack.env, "PULUMI_HOME": str(self.stack.directory / "pulumi-home")}
        argv = ["pulumi", "preview", "--json", "--stack", self.stack.name, "--non-interactive"]
        run = subprocess.run(
            argv, cwd=self.stack.project, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert run.returncode == 0, f"pulumi preview failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
        steps = json.loads(run.stdout).get("steps", [])
        planned: dict[str, str] = {}
        for step in steps:
            # A replacement is listed as several steps; the one that takes the resource away wins.
            if step["op"] in REPLACING | DELETING or step["urn"] not in planned:
                planned[step["urn"]] = step["op"]
        return planned

    def up(self) -> dict[str, str]:
        """`up` (the API, which does not preview first): URN -> the operation the engine ran."""
        done: dict[str, str] = {}

        def record(event: auto.EngineEvent) -> None:
            outputs = event.res_outputs_event
            if outputs is not None:
                op = str(getattr(outputs.metadata.op, "value", outputs.metadata.op))
                if op in REPLACING | DELETING or outputs.metadata.urn not in done:
                    done[outputs.metadata.urn] = op

        self.stack.log.clear()
        try:
            self.stack.stack().up(color="never", on_output=self.stack.log.append, on_event=record, parallel=PARALLEL)
        except auto.CommandError as error:
            pytest.fail(f"pulumi up failed:\n{self.stack.text()[-6000:]}\n{error}")
        return done

    def preview_then_up(self, *, exact: bool = False) -> tuple[dict[str, str], dict[str, str]]:
        planned = self.preview()
        done = self.up()
        planned_removals, done_removals = removals(planned), removals(done)
        # The preview takes away nothing the up keeps: what `scripts/hk3s up` would ask about.
        unexpected = {urn: op for urn, op in planned_removals.items() if done_removals.get(urn) != op}
        assert not unexpected, f"the preview plans removals the up did not make: {unexpected}"
        # No more and no less (`exact`): every resource the preview plans to change, the up changes
        # the same way, and the up changes nothing the preview did not plan. Not yet for the changes
        # that update a Python dynamic resource whose outputs others take (the server's k3s, the
        # network plan): Pulumi's dynamic provider host has no preview support, so such an update's
        # outputs are unknown in the preview and everything that takes them is announced as updated.
        said, made = changes(planned), changes(done)
        assert not exact or said == made, (
            f"the preview planned {sorted(set(said.items()) - set(made.items()))} that the up did not make, "
            f"the up made {sorted(set(made.items()) - set(said.items()))} that the preview did not plan"
        )
        # Longhorn's objects and their provider stay: none of these changes is another cluster.
        longhorn = {urn: op for urn, op in {**planned_removals, **done_removals}.items() if "kubernetes" in urn}
        assert not longhorn, f"Longhorn's objects replaced or deleted: {longhorn}"
        return planned, done


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_kubernetes_provider()
    skip_without_lab_binaries("k3s-patch")
    server = lab.add_host(server_spec("pv-server"))
    w1, w2 = lab.add_host(worker_spec("pv-worker-1")), lab.add_host(worker_spec("pv-worker-2"))
    lab.wait_ssh_ready([server, w1, w2])
    keys = tmp_path_factory.mktemp("preview-keys")
    shutil.copy2(lab.ssh_private_key_path, keys / "lab")
    shutil.copy2(lab.ssh_private_key_path.with_suffix(".pub"), keys / "lab.pub")
    cluster = Cluster(lab, LabStack(tmp_path_factory.mktemp("preview-stack")), server, w1, w2, keys)
    cluster.write([w1], ssh={"private_key_file": str(keys / "lab")})
    up_or_fail(cluster.stack)
    yield cluster


def test_adding_a_worker(cluster: Cluster) -> None:
    cluster.write([cluster.w1, cluster.w2])
    planned, done = cluster.preview_then_up()
    for operations in (planned, done):
        assert any(cluster.w2.name in urn and op == "create" for urn, op in operations.items()), operations


def test_removing_a_worker(cluster: Cluster) -> None:
    cluster.write([cluster.w1])
    planned, done = cluster.preview_then_up()
    # The worker's resources go, in the preview as in the up.
    assert removals(planned) == removals(done) and removals(done), done


def test_a_k3s_patch_upgrade(cluster: Cluster) -> None:
    cluster.write([cluster.w1], cluster=k3s_release("k3s-patch"))
    cluster.preview_then_up()


def test_a_login_key_rotation(cluster: Cluster) -> None:
    new = cluster.keys / "rotated"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rotated", "-f", str(new)], check=True)
    cluster.write([cluster.w1], ssh={"private_key_file": str(new)})
    cluster.preview_then_up()


def test_new_labels(cluster: Cluster) -> None:
    cluster.write([cluster.w1], labels={cluster.w1.name: {"example.com/tier": "fast"}})
    cluster.preview_then_up(exact=True)


def test_teardown_allowed(cluster: Cluster) -> None:
    cluster.write([cluster.w1], cluster={"teardown": "allowed"})
    cluster.preview_then_up()


def test_a_new_api_forward_port(cluster: Cluster) -> None:
    # Another port than the lab's own (stack_harness.base_config), in the same range.
    port = 17000 + (int(cluster.lab.lab_id[2:], 16) + 5003) % 10000
    cluster.write([cluster.w1], cluster={"api_forward_port": port})
    _, done = cluster.preview_then_up(exact=True)
    provider = [urn for urn in done if urn.split("::")[-1] == "storage-kubernetes"]
    assert provider and done[provider[0]] == "update", done
