"""The SDK's real dynamic provider host (`python -m pulumi.dynamic`), started as the engine starts
it, for tests that talk to it over gRPC as the engine does."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
from pulumi.runtime.proto import provider_pb2_grpc

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def running_provider_host(
    stderr: int = subprocess.PIPE,
) -> Iterator[tuple[provider_pb2_grpc.ResourceProviderStub, subprocess.Popen[bytes]]]:
    """The provider host and a stub on its port; killed at the end."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pulumi.dynamic"],
        cwd=REPO,
        # As the engine starts it: stdin a pipe whose writing end the engine holds while it runs
        # (the host exits when that end closes, providers/engine_watch.py).
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env={**os.environ, "PULUMI_PROJECT": "hk3s"},
    )
    assert process.stdout is not None
    port = int(process.stdout.readline().decode().strip())  # first stdout line: the port
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield provider_pb2_grpc.ResourceProviderStub(channel), process
    finally:
        channel.close()
        process.kill()
        process.wait()
