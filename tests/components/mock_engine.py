"""Pulumi mocks for component wiring tests.

Mocks stand in for the engine. The program's own reads of the Hetzner project go, through
Hetzner's library, to the lab's Hetzner API stand-in (a real HTTP server in this process),
seeded with the catalogue and holdings a test gives ClusterMocks; the Pulumi provider's
data sources and resources are mocked. The monitor records every RegisterResource request as
the engine would receive it: type, name, parent, dependencies, and the raw
property struct (where secrets are still marked secret). The dynamic
providers are pickled by the SDK exactly as in a real deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc

from components import hetzner_project, storage_copies
from lab import hcloud_catalog
from lab.hcloud_standin import HcloudStandin, SwitchedMachine, running_standin
from remote_access.api_forward import ApiForward
from remote_access.hetzner_api import HetznerAccess
from remote_access.ssh import SshTarget

# The wire marker of a secret value: {SIG_KEY: SECRET_SIG, "value": ...}
SIG_KEY = rpc._special_sig_key
SECRET_SIG = rpc._special_secret_sig


def fake_ipv4(name: str, prefix: str = "198.51.100") -> str:
    return f"{prefix}.{int(hashlib.sha256(name.encode()).hexdigest(), 16) % 200 + 20}"


def fake_id(name: str) -> str:
    """Hetzner ids are numbers; a deterministic one per resource name."""
    return str(int(hashlib.sha256(name.encode()).hexdigest(), 16) % 10**8)


EU = ("fsn1", "nbg1", "hel1")
# Hetzner's catalogue as the Hetzner API stand-in serves it to the runs (`hetzner_reads`), after
# Hetzner removed the CX Gen 2 and CPX Gen 1 types at the end of 2025 (its changelog): CX and
# CAX are offered in the EU locations only. (name, architecture, locations, removed after)
HETZNER_SERVER_TYPES: list[tuple[str, str, tuple[str, ...], str]] = [
    ("cx23", "x86", EU, ""),
    ("cx33", "x86", EU, ""),
    ("cx43", "x86", EU, ""),
    ("cax11", "arm", EU, ""),
    ("cpx22", "x86", (*EU, "ash", "hil", "sin"), ""),
    ("ccx13", "x86", (*EU, "ash", "hil", "sin"), ""),
    ("cpx21", "x86", (*EU, "ash", "hil"), "2025-12-31T00:00:00Z"),
]
HETZNER_IMAGES: list[tuple[str, str]] = [
    (name, arch) for name in ("ubuntu-24.04", "ubuntu-22.04", "debian-12", "debian-13") for arch in ("x86", "arm")
]


@dataclass
class Registration:
    type: str
    name: str
    urn: str
    parent: str
    dependencies: list[str]
    raw: Any
    inputs: dict[str, Any]
    additional_secret_outputs: list[str]
    provider: str
    protect: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    custom: bool = True
    retain_on_delete: bool = False
    aliases: list[str] = field(default_factory=list)
    """The logical names of the resource's aliases (alias specs' `name`)."""

    def is_secret(self, key: str) -> bool:
        value = self.raw.fields.get(key)
        if value is None:
            return False
        fields = value.struct_value.fields
        return SIG_KEY in fields and fields[SIG_KEY].string_value == SECRET_SIG


@dataclass
class Recording:
    registrations: list[Registration] = field(default_factory=list)
    forwards: list[tuple[SshTarget, int]] = field(default_factory=list)
    """Each forward to the Kubernetes API the program asked for: the server's login and the port."""

    def record_forward(self, server: SshTarget, local_port: int, outlive_pid: int | None = None) -> ApiForward:
        self.forwards.append((server, local_port))
        return ApiForward(local_port, pid=0, started=False)

    def by_name(self, name: str) -> Registration:
        found = [r for r in self.registrations if r.name == name]
        assert len(found) == 1, f"expected one resource named {name}, found {[r.type for r in found]}"
        return found[0]

    def of_type(self, suffix: str) -> list[Registration]:
        return [r for r in self.registrations if r.type.endswith(suffix)]

    def urn_of(self, name: str) -> str:
        return self.by_name(name).urn

    def dependencies_of(self, name: str) -> set[str]:
        """Every resource `name` depends on, directly or through others (URNs): what the engine
        creates or updates before it, and a destroy deletes after it."""
        by_urn = {r.urn: r for r in self.registrations}
        found: set[str] = set()
        pending = list(self.by_name(name).dependencies)
        while pending:
            urn = pending.pop()
            if urn not in found and urn in by_urn:
                found.add(urn)
                pending.extend(by_urn[urn].dependencies)
        return found


class ClusterMocks(pulumi.runtime.Mocks):
    """Outputs a real deployment would produce, deterministic per resource name.

    `hetzner_ssh_keys` is what Hetzner's SSH key list (the `getSshKeys` data source) returns:
    dicts with id, name, fingerprint, public_key and labels. `calls` records every invoke."""

    def __init__(
        self,
        hetzner_ssh_keys: list[dict[str, Any]] | None = None,
        server_state: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.hetzner_ssh_keys = list(hetzner_ssh_keys or [])
        # Outputs of servers as an earlier run left them (what the engine hands back for an input it ignores).
        self.server_state = dict(server_state or {})
        self.calls: list[tuple[str, dict[str, Any]]] = []
        # What the stack's StackIdentity holds in its state (providers.stack_identity).
        self.stack_id = "5eed0f57ac1d0000"
        # What Hetzner's catalogue and the project hold (see HETZNER_SERVER_TYPES); tests add to them.
        self.hetzner_server_types = list(HETZNER_SERVER_TYPES)
        self.hetzner_servers: list[tuple[str, dict[str, str]]] = []
        self.hetzner_networks: list[tuple[str, dict[str, str]]] = []
        self.hetzner_firewalls: list[tuple[str, dict[str, str]]] = []
        self.hetzner_placement_groups: list[tuple[str, dict[str, str]]] = []
        # Images Hetzner has deprecated: name -> the date it stops creating servers from them.
        self.hetzner_deprecated_images: dict[str, str] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        outputs = dict(args.inputs)
        name = args.name
        if args.typ == "hcloud:index/server:Server":
            outputs["ipv4Address"] = fake_ipv4(name)
            outputs.update(self.server_state.get(name, {}))
        elif args.typ == "hcloud:index/serverNetwork:ServerNetwork":
            outputs["ip"] = fake_ipv4(name, "10.0.1")
        elif args.typ.endswith("hk3s:HostProbe"):
            outputs["host_key"] = (
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + hashlib.sha256(name.encode()).hexdigest()[:40]
            )
        elif args.typ.endswith("hk3s:K3sServer"):
            outputs.update(
                version=args.inputs["k3s_version"],
                ca_hash="ab" * 32,
                kubeconfig=(
                    "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: Q0E=\n"
                    f"    server: https://{args.inputs.get('address', '198.51.100.1')}:6443\n  name: default\n# secret"
                ),
                api_endpoint="https://10.0.1.2:6443",
            )
        elif args.typ.endswith("hk3s:StackIdentity"):
            # Generated once by its provider and kept in the state; a stack rename keeps the state.
            outputs["stack_id"] = self.stack_id
        elif args.typ.endswith("hk3s:K3sUpgrade"):
            outputs.update(version=args.inputs["k3s_version"], upgraded=[])
        elif args.typ.endswith("hk3s:NetworkPlan"):
            # Stands in for the routing-table decision (node_operations.network_mode, tested on
            # its own and in the lab): private uses each node's private address where it has one.
            mode = "public" if args.inputs["mode_setting"] != "private" else "private"
            nodes = [args.inputs["server"], *args.inputs["workers"]]
            outputs.update(
                mode=mode,
                nat_nodes=[],
                addresses={
                    node["node"]: (node.get("private_address") if mode == "private" else None) or node["public_address"]
                    for node in nodes
                },
                paths={},
            )
            outputs["node_ips"] = outputs["addresses"]
        elif args.typ.endswith("hk3s:NodeJoin"):
            outputs.update(
                name=args.inputs["node"],
                addresses=[args.inputs["address"]],
                network_mode_in_use="public",
                k3s_version_in_use=args.inputs.get("k3s_version"),
                state="ready",
            )
        return fake_id(name), outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        self.calls.append((args.token, dict(args.args)))
        if args.token == "hcloud:index/getSshKeys:getSshKeys":
            keys = [
                {
                    "id": key["id"],
                    "name": key["name"],
                    "fingerprint": key["fingerprint"],
                    "publicKey": key.get("public_key", ""),
                    "labels": key.get("labels", {}),
                }
                for key in self.hetzner_ssh_keys
            ]
            return {"id": "ssh-keys", "sshKeys": keys}, []
        return {}, []


class RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks, recording: Recording) -> None:
        super().__init__(mocks)
        self.recording = recording

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.recording.registrations.append(
                Registration(
                    type=request.type,
                    name=request.name,
                    urn=response.urn,
                    parent=request.parent,
                    dependencies=list(request.dependencies),
                    raw=request.object,
                    inputs=rpc.deserialize_properties(request.object),
                    additional_secret_outputs=list(request.additionalSecretOutputs),
                    provider=request.provider,
                    protect=bool(request.protect),
                    ignore_changes=list(request.ignoreChanges),
                    custom=bool(request.custom),
                    retain_on_delete=bool(request.retainOnDelete),
                    aliases=[alias.spec.name for alias in request.aliases if alias.HasField("spec")],
                )
            )
        return response


def _deprecation(unavailable_after: str) -> dict[str, str] | None:
    return {"announced": "2025-10-16T00:00:00Z", "unavailable_after": unavailable_after} if unavailable_after else None


def api_server_type(name: str, architecture: str, locations: tuple[str, ...], removed_after: str) -> dict[str, Any]:
    """One of HETZNER_SERVER_TYPES as Hetzner's API ("Server Types") hands it over: per location
    `available` and `deprecation` (a removed type: deprecated, unavailable after `removed_after`)."""
    return {
        **hcloud_catalog.server_type_view("cx23"),
        "id": int(fake_id(name)),
        "name": name,
        "description": name.upper(),
        "architecture": architecture,
        "deprecated": bool(removed_after),
        "deprecation": _deprecation(removed_after),
        "locations": [
            {
                "id": index + 1,
                "name": location,
                "deprecation": _deprecation(removed_after),
                "available": True,
                "recommended": not removed_after,
            }
            for index, location in enumerate(locations)
        ],
    }


def api_image(name: str, architecture: str, unavailable_after: str = "") -> dict[str, Any]:
    """One of HETZNER_IMAGES as Hetzner's API ("Images") hands it over; deprecated when
    `unavailable_after` (the date Hetzner stops creating servers from it) is given."""
    return {
        **hcloud_catalog.image_view("debian-12"),
        "id": int(fake_id(f"{name}-{architecture}")),
        "name": name,
        "description": name,
        "os_flavor": name.split("-", maxsplit=1)[0],
        "os_version": name.split("-")[1],
        "architecture": architecture,
        "deprecated": "2025-10-16T00:00:00Z" if unavailable_after else None,
        "deprecation": _deprecation(unavailable_after),
    }


def seed_standin(standin: HcloudStandin, mocks: ClusterMocks) -> None:
    """Give the Hetzner API stand-in the catalogue and holdings `mocks` describe."""
    standin.catalog["server_types"] = [api_server_type(*item) for item in mocks.hetzner_server_types]
    standin.catalog["images"] = [
        api_image(*image, mocks.hetzner_deprecated_images.get(image[0], "")) for image in HETZNER_IMAGES
    ]
    for name, labels in mocks.hetzner_servers:
        standin.add_server(name, SwitchedMachine(), public_ipv4=fake_ipv4(name), private_ips=(), labels=labels)
    # The rest as a user makes them: through the API.
    client = HetznerAccess(standin.token, standin.url).client()
    for name, labels in mocks.hetzner_networks:
        client.networks.create(name=name, ip_range="10.0.0.0/16", labels=labels)
    for name, labels in mocks.hetzner_firewalls:
        # hcloud 2.27 annotates this `labels` as str; the API (and the library) take the object.
        client.firewalls.create(name=name, labels=labels)  # type: ignore[arg-type]
    for name, labels in mocks.hetzner_placement_groups:
        client.placement_groups.create(name=name, type="spread", labels=labels)


@contextlib.contextmanager
def hetzner_reads(mocks: ClusterMocks) -> Iterator[HcloudStandin]:
    """The program's reads of the Hetzner project go to the lab's Hetzner API stand-in (a real
    HTTP server, read through Hetzner's own library) seeded with what `mocks` describe."""
    with running_standin() as standin:
        seed_standin(standin, mocks)
        access = HetznerAccess(standin.token, standin.url)
        original = hetzner_project.read_hetzner_project
        hetzner_project.read_hetzner_project = lambda access=access: original(access)
        try:
            yield standin
        finally:
            hetzner_project.read_hetzner_project = original


def run_with_mocks(
    program: Callable[[], Any],
    recording: Recording | None = None,
    *,
    mocks: ClusterMocks | None = None,
    stack: str = "test",
) -> Recording:
    """Run `program` against the recording mock engine and wait for every RPC."""
    recording = recording if recording is not None else Recording()
    mocks = mocks if mocks is not None else ClusterMocks()
    # Pulumi's mock runtime uses the thread's current event loop; an earlier test's asyncio.run()
    # leaves the main thread with none, so give it one.
    asyncio.set_event_loop(asyncio.new_event_loop())
    # A fresh root stack, as each real run has: set_mocks keeps an earlier run's, and with it
    # that run's stack transformations, which would tie this run's resources to its resources.
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(
        mocks, project="hk3s", stack=stack, preview=False, monitor=RecordingMonitor(mocks, recording)
    )

    @pulumi.runtime.test
    def wrapped() -> Any:
        program()
        return pulumi.Output.from_input(None)

    # No host answers under mocks: the forward to the Kubernetes API is recorded, not opened.
    original = storage_copies.open_api_forward
    storage_copies.open_api_forward = recording.record_forward
    try:
        with hetzner_reads(mocks):
            wrapped()
    finally:
        storage_copies.open_api_forward = original
    return recording
