"""How a provider's exception reaches `pulumi up`: through the SDK's real dynamic-provider
host (`python -m pulumi.dynamic`, driven over gRPC as the engine drives it), the program's
own errors arrive as their message alone; an unexpected exception keeps its traceback."""

from __future__ import annotations

import asyncio
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import proto, rpc
from pulumi.runtime.proto import provider_pb2_grpc

from node_operations.join import JoinError
from providers.base import format_provider_error, present_program_errors
from providers.host_probe import HostProbeProvider
from tests.providers.provider_host import running_provider_host

REPO = Path(__file__).resolve().parents[2]
URN = "urn:pulumi:test::hk3s::pulumi-python:dynamic/hk3s:HostProbe::worker-1-probe"
TRACEBACK = "Traceback (most recent call last)"


@pytest.fixture
def provider_host() -> Iterator[provider_pb2_grpc.ResourceProviderStub]:
    with running_provider_host(stderr=subprocess.DEVNULL) as (stub, _process):
        stub.Configure(proto.ConfigureRequest(args=_struct({}), acceptSecrets=False))
        yield stub


def _struct(props: dict[str, Any]) -> struct_pb2.Struct:
    return asyncio.run(rpc.serialize_properties(props, {}))


def _create_details(stub: provider_pb2_grpc.ResourceProviderStub, props: dict[str, Any]) -> str:
    news = {**props, "__provider": serialize_provider(HostProbeProvider())}
    with pytest.raises(grpc.RpcError) as caught:
        stub.Create(proto.CreateRequest(urn=URN, properties=_struct(news), timeout=30))
    return str(caught.value.details())


def test_a_program_error_reaches_the_engine_as_its_message_alone(provider_host: Any) -> None:
    # A key that cannot be read: the SSH layer's error, raised on purpose with the fix, before
    # any connection is tried.
    details = _create_details(
        provider_host,
        # The provider runs with no terminal, as under the engine: the stack opts in to first
        # use, so the run gets as far as reading the key.
        {
            "node": "worker-1",
            "address": "127.0.0.1",
            "ssh_port": 22,
            "private_key": "not a key",
            "trust_on_first_use": True,
        },
    )
    assert details.startswith("worker-1: the SSH private key (hk3s:ssh.private_key_file) cannot be read"), details
    assert details.rstrip().endswith("give an unencrypted OpenSSH or PEM private key"), details
    assert TRACEBACK not in details and "File " not in details and "SshError" not in details


def test_an_unexpected_exception_keeps_its_traceback(provider_host: Any) -> None:
    # No address at all: a KeyError deep in the provider, which is a bug, not a refusal.
    details = _create_details(provider_host, {"node": "worker-1", "private_key": _private_key()})
    assert TRACEBACK in details and "KeyError: 'address'" in details and "/providers/" in details


def test_formatting_keeps_tracebacks_for_everything_but_program_errors() -> None:
    def raising(error: BaseException) -> BaseException:
        try:
            raise error
        except BaseException as caught:
            return caught

    stopped = raising(JoinError("worker-2", "ca-hash", "the agent refuses the server's CA"))
    assert format_provider_error(stopped) == "worker-2: join stopped at ca-hash: the agent refuses the server's CA"
    bug = raising(ZeroDivisionError("division by zero"))
    formatted = format_provider_error(bug)
    assert formatted.startswith(TRACEBACK) and formatted.endswith("ZeroDivisionError: division by zero\n")


def test_only_the_sdk_provider_host_is_changed() -> None:
    # The program itself, a test runner or any other __main__ is left alone.
    assert present_program_errors(None) is False
    other = types.ModuleType("__main__")
    other.traceback = __import__("traceback")  # type: ignore[attr-defined]
    assert present_program_errors(other) is False
    assert other.traceback is __import__("traceback")


def _private_key() -> str:
    # Any well-formed key: the connection fails before authentication.
    import asyncssh  # noqa: PLC0415

    return asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
