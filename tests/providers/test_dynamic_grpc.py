"""HostProbe driven the way the engine drives it: through the SDK's
`python -m pulumi.dynamic` gRPC server (Configure, Check, Create, Diff, Read,
Delete), against a real sshd on loopback; and a preview's unknown input through
the same server to a check. No mocks."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.output import Unknown
from pulumi.runtime import proto, rpc
from pulumi.runtime.proto import provider_pb2_grpc

from providers.host_probe import HostProbeProvider
from providers.inputs import NodeLogin
from providers.longhorn_node_role import LonghornNodeRoleInputs, LonghornNodeRoleProvider
from remote_access.ssh import fingerprint
from tests.loopback_sshd import LoopbackSshd
from tests.providers.provider_host import running_provider_host

REPO = Path(__file__).resolve().parents[2]
URN = "urn:pulumi:test::hk3s::pulumi-python:dynamic/hk3s:HostProbe::worker-1-probe"


@pytest.fixture
def provider_server() -> Iterator[tuple[provider_pb2_grpc.ResourceProviderStub, subprocess.Popen[bytes]]]:
    with running_provider_host() as running:
        yield running


def _struct(props: dict[str, Any]) -> struct_pb2.Struct:
    return asyncio.run(rpc.serialize_properties(props, {}))


def _dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    return rpc.deserialize_properties(struct)


def test_host_probe_lifecycle_over_grpc(sshd: LoopbackSshd, provider_server: Any) -> None:
    stub, process = provider_server
    stub.Configure(proto.ConfigureRequest(args=_struct({}), acceptSecrets=False))
    news = {
        "node": "worker-1",
        "address": "127.0.0.1",
        "ssh_port": sshd.port,
        "ssh_user": "root",
        "private_key": sshd.client_private_key,
        "__provider": serialize_provider(HostProbeProvider()),
    }
    # Started as the engine starts it, with no terminal on stdin: a run nobody watches, so an
    # unpinned key is recorded only when the stack opts in.
    unattended = stub.Check(proto.CheckRequest(urn=URN, olds=_struct({}), news=_struct(news)))
    assert [f.property for f in unattended.failures] == ["recorded_host_key"]
    assert "no terminal on its standard input" in unattended.failures[0].reason
    news["trust_on_first_use"] = True

    checked = stub.Check(proto.CheckRequest(urn=URN, olds=_struct({}), news=_struct(news)))
    assert list(checked.failures) == []

    bad = stub.Check(proto.CheckRequest(urn=URN, olds=_struct({}), news=_struct({**news, "node": "Worker_1"})))
    assert [f.property for f in bad.failures] == ["node"]

    created = stub.Create(proto.CreateRequest(urn=URN, properties=checked.inputs, timeout=60))
    outs = _dict(created.properties)
    assert created.id == "worker-1@127.0.0.1"
    assert outs["host_key"] == sshd.host_key_line
    assert outs["systemd"] in (True, False) and outs["cpus"] >= 1 and outs["memory_mb"] > 0
    local_routes = subprocess.run(
        ["ip", "-4", "route", "show", "table", "main"], capture_output=True, text=True, check=True
    )
    assert outs["ipv4_routes"] == [line.strip() for line in local_routes.stdout.splitlines()]
    os_release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().split("\n") if "=" in line)
    assert outs["os_id"] == os_release["ID"].strip('"')

    # A later check pins the key recorded on first use.
    rechecked = stub.Check(proto.CheckRequest(urn=URN, olds=created.properties, news=_struct(news)))
    assert _dict(rechecked.inputs)["recorded_host_key"] == sshd.host_key_line

    same = stub.Diff(proto.DiffRequest(id=created.id, urn=URN, olds=created.properties, news=rechecked.inputs))
    assert same.changes == proto.DiffResponse.DIFF_NONE
    moved = _dict(rechecked.inputs) | {"address": "127.0.0.2"}
    replaced = stub.Diff(proto.DiffRequest(id=created.id, urn=URN, olds=created.properties, news=_struct(moved)))
    assert replaced.changes == proto.DiffResponse.DIFF_SOME and list(replaced.replaces) == ["address"]
    reported = _dict(rechecked.inputs) | {"ssh_user": "admin"}
    updated = stub.Diff(proto.DiffRequest(id=created.id, urn=URN, olds=created.properties, news=_struct(reported)))
    assert updated.changes == proto.DiffResponse.DIFF_SOME and list(updated.replaces) == []

    read = stub.Read(proto.ReadRequest(id=created.id, urn=URN, properties=created.properties))
    assert read.id == created.id and _dict(read.properties)["host_key"] == sshd.host_key_line

    # The host is reinstalled: a refresh refuses it and shows both fingerprints.
    old_key = sshd.host_key_line
    sshd.restart_with_new_host_key()
    with pytest.raises(grpc.RpcError) as caught:
        stub.Read(proto.ReadRequest(id=created.id, urn=URN, properties=created.properties))
    details = caught.value.details()
    assert fingerprint(old_key) in details and fingerprint(sshd.host_key_line) in details

    stub.Delete(proto.DeleteRequest(id=created.id, urn=URN, properties=created.properties))

    process.kill()
    _, stderr = process.communicate(timeout=10)
    # Progress lines carry the node name (no per-resource log channel exists).
    assert b"[worker-1] recorded SSH host key on first use" in stderr
    assert sshd.client_private_key.encode() not in stderr


def test_a_preview_with_an_unknown_input_passes_check_over_grpc(provider_server: Any) -> None:
    """The unknown value as the engine sends it in a preview (the placeholder string on the wire),
    through the SDK's host to LonghornNodeRole's check: a worker not probed yet passes, a known
    bad value is refused naming the input."""
    stub, _process = provider_server
    stub.Configure(proto.ConfigureRequest(args=_struct({}), acceptSecrets=False))
    role_urn = "urn:pulumi:test::hk3s::pulumi-python:dynamic/hk3s:LonghornNodeRole::w2-longhorn-role"
    inputs = LonghornNodeRoleInputs(
        login=NodeLogin(node="srv", address="198.51.100.2", private_key="key"), longhorn_node="w2"
    ).props()
    news = {**inputs, "__provider": serialize_provider(LonghornNodeRoleProvider())}

    preview = stub.Check(
        proto.CheckRequest(urn=role_urn, olds=_struct({}), news=_struct({**news, "holds_copies": rpc.UNKNOWN}))
    )
    assert [(f.property, f.reason) for f in preview.failures] == []
    assert isinstance(rpc.deserialize_properties(preview.inputs, keep_unknowns=True)["holds_copies"], Unknown)

    bad = stub.Check(proto.CheckRequest(urn=role_urn, olds=_struct({}), news=_struct({**news, "holds_copies": "yes"})))
    (failure,) = bad.failures
    assert failure.property == "holds_copies" and failure.reason.startswith(
        "holds_copies must be true or false, not 'yes'"
    )
