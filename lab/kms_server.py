"""A KMS-compatible key service for the lab: moto's server mode (PyPI `moto[server]`, pinned in
requirements-dev.txt) on a loopback port, serving the AWS KMS API (CreateKey, Encrypt, Decrypt,
GenerateDataKey) as AWS does, signatures read from the request. A stack whose secrets provider
is `awskms://KEY?region=...&endpoint=http://127.0.0.1:PORT` keeps its data key there: the
Pulumi CLI reaches it through gocloud.dev's awskms keeper, whose `endpoint=` names the service
(gocloud.dev/aws V2ConfigFromURLParams), exactly as it would reach AWS KMS.

    with running_kms_server(tmp_path) as kms:
        url = kms.secrets_provider(kms.create_key())
        env = {**kms.credentials()}
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.session

HOST = "127.0.0.1"
REGION = "us-east-1"


@dataclass
class KmsServer:
    port: int
    process: subprocess.Popen[bytes]
    region: str = REGION

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def credentials(self) -> dict[str, str]:
        """A key pair the service takes (moto accepts any) and the region, as the Pulumi CLI reads them."""
        return {
            "AWS_ACCESS_KEY_ID": "lab-kms-key",
            "AWS_SECRET_ACCESS_KEY": "lab-kms-secret",
            "AWS_REGION": self.region,
        }

    def client(self) -> Any:
        creds = self.credentials()
        return botocore.session.Session().create_client(
            "kms",
            region_name=self.region,
            endpoint_url=self.endpoint,
            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
        )

    def create_key(self) -> str:
        """A new symmetric key's id."""
        return str(self.client().create_key(Description="hk3s lab stack secrets")["KeyMetadata"]["KeyId"])

    def secrets_provider(self, key_id: str) -> str:
        """The stack's secrets provider URL for `key_id` on this service."""
        return f"awskms://{key_id}?region={self.region}&endpoint={self.endpoint}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_kms_server(directory: Path) -> Iterator[KmsServer]:
    """moto's server on a free loopback port until the block ends (its log in `directory`)."""
    port = _free_port()
    log = directory / "kms-server.log"
    env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto's server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not listen on {HOST}:{port}:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield KmsServer(port, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
