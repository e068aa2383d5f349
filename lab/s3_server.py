"""A real S3 server for the lab: versitygw (built by lab/build/versitygw.sh) serving a directory
with its posix backend, each top-level directory a bucket, on a loopback port. The Pulumi CLI
keeps a stack's state there through its DIY backend (`s3://BUCKET?endpoint=...`) exactly as it
would in AWS S3 or any S3-compatible store: it is the real server, signatures and all.

    with running_s3_server(tmp_path) as s3:
        s3.create_bucket("team-state")
        env = {**s3.credentials(), "PULUMI_BACKEND_URL": s3.backend_url("team-state")}

The root account's key pair comes from the environment variables versitygw reads
(ROOT_ACCESS_KEY_ID, ROOT_SECRET_ACCESS_KEY); a second account with other rights is made
through its admin API (`versitygw admin create-user`), with the gateway's internal IAM kept
in the served directory's sibling `iam/`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from operator_api.s3_backend import ALLOW_HTTP, S3Backend

CACHE = Path(os.environ.get("HK3S_LAB_CACHE", "/var/cache/hk3s-lab"))
VERSITYGW = CACHE / "bin" / "versitygw"
REGION = "lab-1"
HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class S3Server:
    """A running versitygw: where it listens and the root account's key pair."""

    directory: Path
    port: int
    admin_port: int
    access_key: str
    secret_key: str
    process: subprocess.Popen[bytes]
    region: str = REGION

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def credentials(self, access_key: str | None = None, secret_key: str | None = None) -> dict[str, str]:
        """The variables the Pulumi CLI (and the operator API) read the key pair from."""
        return {
            "AWS_ACCESS_KEY_ID": access_key or self.access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key or self.secret_key,
            "AWS_REGION": self.region,
            # The gateway listens on plain HTTP on loopback: used as any local MinIO's user would,
            # with the acknowledgement the program asks for (docs/ci.md, keeping state for a team).
            ALLOW_HTTP: "1",
        }

    def backend_url(self, bucket: str, *, endpoint: str | None = None) -> str:
        """The documented form: the endpoint as a URL, path-style addressing, the region."""
        return f"s3://{bucket}?endpoint={endpoint or self.endpoint}&s3ForcePathStyle=true&region={self.region}"

    def client(self, bucket: str, **credentials: str) -> S3Backend:
        env = {**self.credentials(), **credentials}
        return S3Backend.parse(self.backend_url(bucket), env)

    def create_bucket(self, bucket: str) -> None:
        self.client(bucket).client.create_bucket(Bucket=bucket)

    def admin(self, *args: str) -> str:
        """`versitygw admin ARGS` against this gateway's admin port, as its root account."""
        env = {
            **os.environ,
            "ADMIN_ACCESS_KEY_ID": self.access_key,
            "ADMIN_SECRET_ACCESS_KEY": self.secret_key,
            "ADMIN_REGION": self.region,
            "ADMIN_ENDPOINT_URL": f"http://{HOST}:{self.admin_port}",
        }
        result = subprocess.run(
            [str(VERSITYGW), "admin", *args], check=False, env=env, capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0:
            raise RuntimeError(f"versitygw admin {' '.join(args)} failed: {result.stdout}{result.stderr}")
        return result.stdout

    def reader(self, bucket: str) -> dict[str, str]:
        """A second account that may list and read `bucket` but not write it (a bucket policy
        grants it s3:ListBucket and s3:GetObject only): its key pair's variables."""
        access, secret = "lab-reader", secrets.token_hex(16)
        self.admin("create-user", "--access", access, "--secret", secret, "--role", "user")
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": [access]},
                    "Action": ["s3:ListBucket", "s3:GetObject"],
                    "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                }
            ],
        }
        self.client(bucket).client.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
        return self.credentials(access, secret)


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"versitygw exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"versitygw did not listen on {HOST}:{port} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def running_s3_server(directory: Path) -> Iterator[S3Server]:
    """versitygw serving `directory`/data on a free loopback port until the block ends."""
    if not VERSITYGW.exists():
        raise FileNotFoundError(f"{VERSITYGW} is missing: run lab/build/versitygw.sh (lab/setup.sh builds it)")
    data, iam = directory / "data", directory / "iam"
    data.mkdir(parents=True, exist_ok=True)
    iam.mkdir(parents=True, exist_ok=True)
    port, admin_port = _free_port(), _free_port()
    access, secret = "lab-root", secrets.token_hex(16)
    log = directory / "versitygw.log"
    env = {
        **os.environ,
        "ROOT_ACCESS_KEY_ID": access,
        "ROOT_SECRET_ACCESS_KEY": secret,
        "VGW_REGION": REGION,
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(VERSITYGW),
                "--port",
                f"{HOST}:{port}",
                "--admin-port",
                f"{HOST}:{admin_port}",
                "--iam-dir",
                str(iam),
                "posix",
                str(data),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_listening(port, process, log)
        _wait_listening(admin_port, process, log)
        yield S3Server(directory, port, admin_port, access, secret, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
