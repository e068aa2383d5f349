"""The typed contract between the components and the dynamic providers.

Each dynamic resource's inputs are one frozen dataclass: the component builds it (so a
renamed or mistyped field fails the type check there), `props()` flattens it into the dict
the engine stores, and the provider reads the stored dict back with `from_props`.

The engine hands a provider plain dicts, and a stack's state may have been written by an
earlier release: `from_props` ignores keys it does not know (outputs, `__provider`, inputs
since removed) and gives a field missing from the state its default. The keys are the
field names, so the stored inputs of an existing stack read back unchanged and plan no diff.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

import pulumi
from pulumi.output import Unknown
from pulumi.runtime.rpc import UNKNOWN

from node_operations.k3s_install import K3sBinary

T = TypeVar("T")


def known(value: pulumi.Input[T]) -> T:
    """An input as a provider's create, update, read or delete receives it: a plain value
    (the engine resolved every Output before calling the provider)."""
    if isinstance(value, (pulumi.Output, Awaitable)):
        raise TypeError(f"{value!r} is not resolved: providers read plain values")
    return value


def is_known(value: Any) -> bool:
    """False for a value the engine does not know yet (at preview), however the SDK
    hands it over: the wire's placeholder string or an `Unknown` object."""
    if isinstance(value, list):
        return all(is_known(item) for item in value)
    if isinstance(value, dict):
        return all(is_known(item) for item in value.values())
    return value != UNKNOWN and not isinstance(value, Unknown)


def checkable(news: Mapping[str, Any], name: str) -> Any:
    """The input `name` as a provider's `check` may judge it: its value, or None when it is
    absent or not known yet (a list or map with any unknown part counts as not known).

    In a preview, an input that comes from a resource the run has yet to create or update is
    unknown (the engine sends a placeholder string). A check judges only what is known and
    lets the rest pass, or every preview of a routine change (a worker added) would be
    refused. Nothing unjudged reaches a host: the `up` that creates or updates the resource
    runs its check again with every input known (the program registers a resource once its
    inputs have resolved), and only then calls create or update."""
    value = news.get(name)
    return value if is_known(value) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResourceInputs:
    """Base of every dynamic resource's inputs (and of groups of them). A field declared with
    `field(metadata=flat(...))` holds a group whose fields are stored as top-level keys; one
    declared with `field(metadata=nested(...))` holds a group (or a list of them) stored as dicts."""

    def props(self) -> dict[str, Any]:
        """The inputs as the engine stores them."""
        stored: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.metadata.get("flat"):
                stored.update(value.props())
            elif isinstance(value, ResourceInputs):
                stored[field.name] = value.props()
            elif isinstance(value, (list, tuple)):
                stored[field.name] = [item.props() if isinstance(item, ResourceInputs) else item for item in value]
            else:
                stored[field.name] = value
        return stored

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> Self:
        """The inputs a provider received (or the state holds), read tolerantly: unknown keys
        are ignored, a missing key with a default takes it; a missing key without one raises
        KeyError naming it, as reading it by hand would."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            group = field.metadata.get("flat")
            if group is not None:
                values[field.name] = group.from_props(props)
            elif props.get(field.name) is not None:
                values[field.name] = _nested(field, props[field.name])
            elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                if field.name not in props:
                    raise KeyError(field.name)
                values[field.name] = None
        return cls(**values)

    @classmethod
    def stored_keys(cls) -> set[str]:
        """The keys these inputs are stored under."""
        keys: set[str] = set()
        for field in dataclasses.fields(cls):
            group = field.metadata.get("flat")
            keys |= group.stored_keys() if group is not None else {field.name}
        return keys

    @classmethod
    def names(cls, *names: str) -> tuple[str, ...]:
        """`names`, each checked to be a stored input of this resource (for the keys a
        provider's check and diff name): a renamed field fails at import, not in a run."""
        unknown = [name for name in names if name not in cls.stored_keys()]
        if unknown:
            raise AttributeError(f"{cls.__name__} has no input {', '.join(unknown)}")
        return names


def flat(group: type[ResourceInputs]) -> dict[str, Any]:
    """Field metadata: the field holds a `group` of inputs stored as top-level keys."""
    return {"flat": group}


def nested(group: type[ResourceInputs]) -> dict[str, Any]:
    """Field metadata: the field holds a `group` (or a list of them), stored as dicts and read
    back as `group`."""
    return {"nested": group}


def _nested(field: dataclasses.Field[Any], value: Any) -> Any:
    group = field.metadata.get("nested")
    if group is None:
        return value
    if isinstance(value, list):
        return [group.from_props(item) for item in value]
    return group.from_props(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeLogin(ResourceInputs):
    """How a node-facing resource logs in to its host (built once per node:
    components.node_endpoint.NodeEndpoint.login)."""

    node: pulumi.Input[str]
    address: pulumi.Input[str]
    private_key: pulumi.Input[str]
    ssh_port: pulumi.Input[int] = 22
    ssh_user: pulumi.Input[str] = "root"
    recorded_host_key: pulumi.Input[str | None] = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeInputs(ResourceInputs):
    """Inputs of a resource that logs in to one node."""

    login: NodeLogin = dataclasses.field(metadata=flat(NodeLogin))


@dataclasses.dataclass(frozen=True, kw_only=True)
class K3sRelease(ResourceInputs):
    """The k3s a node runs: its version and, with hk3s:cluster.k3s_binary, the binary to upload
    and its SHA-256 (else each host downloads the release)."""

    k3s_version: pulumi.Input[str]
    k3s_binary: pulumi.Input[str] | None = None
    k3s_sha256: pulumi.Input[str] | None = None

    def binary(self) -> K3sBinary:
        path = known(self.k3s_binary) if self.k3s_binary is not None else None
        sha256 = known(self.k3s_sha256) if self.k3s_sha256 is not None else None
        return K3sBinary(
            version=str(known(self.k3s_version)),
            local_path=Path(path) if path else None,
            sha256=sha256 or None,
        )
