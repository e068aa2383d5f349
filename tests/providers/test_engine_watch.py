"""A provider process whose engine is gone ends by itself, through the SDK's real
dynamic-provider host (`python -m pulumi.dynamic`, driven over gRPC as the engine drives it).

The engine starts each provider process with a pipe as its stdin whose writing end only the
engine holds (Pulumi's plugin launcher, `cmd.StdinPipe()`), so the pipe's hang-up is the
engine's end, however it ended. Here the test holds that end, as the engine does, and lets go
of it while the provider is logging in to a host."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import grpc
import pytest
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import proto, rpc
from pulumi.runtime.proto import provider_pb2_grpc

from providers.engine_watch import exit_with_the_engine
from providers.host_probe import HostProbeProvider
from tests.providers.provider_host import running_provider_host

REPO = Path(__file__).resolve().parents[2]
URN = "urn:pulumi:test::hk3s::pulumi-python:dynamic/hk3s:HostProbe::worker-1-probe"


def _struct(props: dict[str, Any]) -> struct_pb2.Struct:
    return asyncio.run(rpc.serialize_properties(props, {}))


@pytest.fixture
def provider_host() -> Iterator[tuple[provider_pb2_grpc.ResourceProviderStub, subprocess.Popen[bytes]]]:
    with running_provider_host() as running:
        yield running


def test_a_provider_whose_engine_is_gone_exits_mid_login_and_drops_the_connection(provider_host: Any) -> None:
    stub, process = provider_host
    # A host that takes the TCP connection and never answers: a login in progress for as long as
    # the provider waits for a first contact (minutes), unless the provider ends.
    host = socket.create_server(("127.0.0.1", 0))
    host.settimeout(30)
    key = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    news = {
        "node": "worker-1",
        "address": "127.0.0.1",
        "ssh_port": host.getsockname()[1],
        "ssh_user": "root",
        "private_key": key,
        "trust_on_first_use": True,
        "__provider": serialize_provider(HostProbeProvider()),
    }
    stub.Configure(proto.ConfigureRequest(args=_struct({}), acceptSecrets=False))
    checked = stub.Check(proto.CheckRequest(urn=URN, olds=_struct({}), news=_struct(news)))
    assert list(checked.failures) == []
    # The provider's code is loaded and its engine is there: it keeps serving.
    time.sleep(2)
    assert process.poll() is None, process.stderr.read().decode()[-3000:]

    pending = stub.Create.future(proto.CreateRequest(urn=URN, properties=checked.inputs, timeout=600))
    login, _ = host.accept()  # the provider is connected, waiting for the host's SSH banner
    login.settimeout(30)
    process.stdin.close()  # the engine is gone (a `kill -9` of `pulumi up` closes it the same way)

    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("the provider process still runs 10 s after its engine went away")
    # Its login went with it: the host sees the connection closed, not left open; a connection
    # still open times the read out. (Under load the provider may end between the TCP connect
    # and its banner: then the close comes with nothing before it.)
    received = b""
    while chunk := login.recv(1024):
        received += chunk
    assert received == b"" or received.startswith(b"SSH-2.0-"), received
    with pytest.raises(grpc.RpcError):
        pending.result(timeout=10)
    login.close()
    host.close()


def test_the_watch_starts_only_in_the_sdk_provider_host_on_the_engine_pipe(tmp_path: Path) -> None:
    assert exit_with_the_engine(None) is False
    other = types.ModuleType("__main__")
    other.__spec__ = types.SimpleNamespace(name="pytest.__main__")  # type: ignore[assignment]
    assert exit_with_the_engine(other) is False
    host = types.ModuleType("__main__")
    host.__spec__ = types.SimpleNamespace(name="pulumi.dynamic.__main__")  # type: ignore[assignment]
    # Started by hand from a terminal or with a file as stdin, no engine holds a pipe to it:
    # nothing to watch, and it never ends because of its stdin.
    regular = tmp_path / "stdin"
    regular.write_text("")
    with regular.open() as stdin:
        assert exit_with_the_engine(host, stdin.fileno()) is False
