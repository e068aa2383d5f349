"""A small client of the Kubernetes API for the Longhorn stand-in's manager (LAB ONLY).

Built from a kubeconfig (the admin kubeconfig the k3s stand-in's server writes), with the
client certificate and CA it embeds written to files of its own; only the calls the manager
makes: list, get, create, merge-patch (object and status subresource) and delete.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

LONGHORN_GROUP = "/apis/longhorn.io/v1beta2/namespaces/longhorn-system"


class KubeError(RuntimeError):
    """An API request got an unexpected answer."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")


@dataclass
class Kube:
    """The Kubernetes API at `server` with a client certificate."""

    server: str
    ca: Path
    cert: Path
    key: Path
    timeout: float = 10.0

    def __post_init__(self) -> None:
        self.session = requests.Session()
        # Only the cluster's CA: no proxy or CA bundle from the environment (requests prefers an
        # environment's REQUESTS_CA_BUNDLE over the session's own CA).
        self.session.trust_env = False
        self.session.verify = str(self.ca)
        self.session.cert = (str(self.cert), str(self.key))

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path, files: Path, server: str | None = None) -> Kube:
        """The client a kubeconfig describes (its first cluster and user); its certificates are
        written under `files`; `server` replaces the kubeconfig's server URL when given."""
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        files.mkdir(parents=True, exist_ok=True)
        paths = {}
        for name, field in (("ca.crt", cluster), ("client.crt", user), ("client.key", user)):
            key = {"ca.crt": "certificate-authority-data", "client.crt": "client-certificate-data"}.get(
                name, "client-key-data"
            )
            path = files / name
            path.write_bytes(base64.b64decode(field[key]))
            path.chmod(0o600)
            paths[name] = path
        return cls(server or cluster["server"], paths["ca.crt"], paths["client.crt"], paths["client.key"])

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        response = self.session.request(
            method,
            self.server + path,
            data=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type, "Accept": "application/json"},
            timeout=self.timeout,
        )
        if response.status_code >= 300:
            raise KubeError(method, path, response.status_code, response.text)
        return response.json() if response.content else None

    def items(self, path: str) -> list[dict[str, Any]]:
        return list(self.request("GET", path).get("items") or [])

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", path, body))

    def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("PATCH", path, patch, content_type="application/merge-patch+json"))

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path)
        except KubeError as err:
            if err.status != 404:
                raise
