"""Run this program against lab hosts through the real Pulumi CLI and the
Automation API: a copy of the project with a generated stack file, a local
file backend, the lab's CLI. Used by the lab tests of the join and the
automation layer."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto

from lab.hosts import Host, HostSpec, Lab

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HK3S_LAB_CACHE", "/var/cache/hk3s-lab"))
BIN = CACHE / "bin"
KUBE_BIN_IN_HOST = "/opt/lab-kube/bin"
# Longhorn's packages baked into the lab base so joins need not download them every time;
# node_prepare.sh still checks them (one lab test joins a host without them).
LONGHORN_PACKAGES = ("open-iscsi", "nfs-common")


def lab_binaries_missing() -> list[str]:
    wanted = ("pulumi", "pulumi-language-python", "k3s", "k3s.sha256", "kube-apiserver", "kine")
    return [name for name in wanted if not (BIN / name).exists()]


def k3s_version() -> str:
    out = subprocess.run([str(BIN / "k3s"), "--version"], capture_output=True, text=True, check=True).stdout
    return out.split()[2]


def server_spec(name: str, **overrides: Any) -> HostSpec:
    """A lab host that can run the k3s stand-in's server (the control plane binaries bound in)."""
    values: dict[str, Any] = {"extra_binds": [(BIN, KUBE_BIN_IN_HOST)], "extra_packages": LONGHORN_PACKAGES}
    values.update(overrides)
    return HostSpec(name, **values)


def worker_spec(name: str, **overrides: Any) -> HostSpec:
    values: dict[str, Any] = {"extra_packages": LONGHORN_PACKAGES}
    values.update(overrides)
    return HostSpec(name, **values)


def base_config(lab: Lab, server: Host, workers: Sequence[Host], **sections: Any) -> dict[str, Any]:
    """A stack config for existing lab hosts in public mode."""
    config: dict[str, Any] = {
        "cluster": {
            "k3s_version": k3s_version(),
            "k3s_binary": str(BIN / "k3s"),
            "k3s_sha256": (BIN / "k3s.sha256").read_text().split()[0],
            "pod_network": "vxlan",  # the lab's kernel has no WireGuard module
        },
        "server": {"name": server.name, "kind": "existing", "address": server.public_ip},
        "ssh": {"private_key_file": str(lab.ssh_private_key_path)},
        "network": {"mode": "public"},
        "firewall": {"managed": False, "cloud_firewall": False},
        "storage": {"install_longhorn": False},
        # The disk probe for volume copies is not in this release: the lab workers hold none.
        "workers": [
            {"name": w.name, "kind": "existing", "address": w.public_ip, "holds_copies": False} for w in workers
        ],
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


@dataclass
class LabStack:
    """A copy of the project and one stack of it."""

    directory: Path
    name: str = "lab"
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        project = self.directory / "project"
        if not project.exists():
            listed = subprocess.run(
                ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            for name in listed:
                source = REPO / name
                if source.is_file() and not name.startswith(("lab/k3s_standin/", "tests/")):
                    (project / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, project / name)
            (project / "venv").symlink_to(REPO / "venv")
        (self.directory / "state").mkdir(exist_ok=True)
        self.project = project
        self.env = {
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_CONFIG_PASSPHRASE": "hk3s-lab-passphrase",
            "PULUMI_BACKEND_URL": (self.directory / "state").as_uri(),
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_PYTHON_CMD": str(REPO / "venv" / "bin" / "python"),
        }

    def write_config(self, config: dict[str, Any]) -> None:
        document = {"config": {f"hk3s:{key}": value for key, value in config.items()}}
        (self.project / f"Pulumi.{self.name}.yaml").write_text(yaml.safe_dump(document, sort_keys=False))

    def stack(self) -> auto.Stack:
        workspace = auto.LocalWorkspace(
            work_dir=str(self.project),
            pulumi_home=str(self.directory / "pulumi-home"),
            env_vars=self.env,
            pulumi_command=auto.PulumiCommand(root=str(CACHE)),
        )
        return auto.Stack.create_or_select(self.name, workspace)

    def up(self, on_output: Callable[[str], None] | None = None) -> auto.UpResult:
        def record(line: str) -> None:
            self.log.append(line)
            if on_output is not None:
                on_output(line)

        return self.stack().up(color="never", on_output=record)

    def preview(self) -> auto.PreviewResult:
        return self.stack().preview(color="never", on_output=self.log.append)

    def refresh(self, *args: str) -> auto.RefreshResult:
        return self.stack().refresh(color="never", on_output=self.log.append)

    def text(self) -> str:
        return "\n".join(self.log)
