"""Node labels the kubelet would refuse are refused by the settings check, at `preview`.

k3s hands every ``--node-label`` of its config to the kubelet's ``--node-labels`` at each
start, and the kubelet will not start with a label in the ``kubernetes.io``/``k8s.io``
namespaces (the domains and every subdomain) unless it is one a kubelet may set on its own
Node: Kubernetes' cmd/kubelet/app/options/options.go ``ValidateKubeletFlags`` refuses
``isKubernetesLabel(k) && !IsKubeletLabel(k)``, and
staging/src/k8s.io/kubelet/pkg/apis/well_known_labels.go ``IsKubeletLabel`` allows the keys
of ``kubeletLabels`` and the namespaces ``kubelet.kubernetes.io`` and ``node.kubernetes.io``
with their subdomains.  A key such as ``team.kubernetes.io/x`` passed the old check (which
refused only the ``kubernetes.io/`` and ``k8s.io/`` prefixes themselves) and crash-looped the
agent.

The last test runs the lab's k3s stand-in agent (lab/k3s_standin, whose ``nodeOptions``
applies the kubelet's rule with the kubelet's message) with the keys the settings accept and
those they refuse: the settings and the kubelet agree.
"""

from __future__ import annotations

import selectors
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cluster_settings import SettingsError, load_settings
from cluster_settings.kubelet_labels import kubelet_refuses_label
from lab.stack_harness import BIN, skip_without_lab_binaries
from tests.lab_itself.ports import free_port

# Keys the kubelet refuses in --node-labels, and for each the reason in its rule.
KUBELET_REFUSES = [
    "team.kubernetes.io/x",  # a subdomain of kubernetes.io outside the allowed namespaces
    "example.k8s.io/x",  # a subdomain of k8s.io
    "node-restriction.kubernetes.io/pool",  # NodeRestriction's namespace: for administrators only
    "kubelet.k8s.io/x",  # the allowed namespaces are under kubernetes.io, not k8s.io
    "topology.kubernetes.io/rack",  # topology.kubernetes.io allows only zone and region
    "beta.kubernetes.io/fluentd-ds-ready",  # beta.kubernetes.io allows only os, arch, instance-type
]
# Keys the kubelet takes (and the program does not set itself).
KUBELET_TAKES = [
    "example.com/team",
    "tier",
    "notkubernetes.io/x",  # not a subdomain of kubernetes.io: any other domain
    "kubernetes.io.example.com/x",
    "node.kubernetes.io/pool",
    "batch.node.kubernetes.io/x",
    "kubelet.kubernetes.io/x",
    "a.kubelet.kubernetes.io/x",
    "topology.kubernetes.io/zone",
    "node.kubernetes.io/instance-type",
]


def _config(key_file: Path, labels: dict[str, str], *, pool: bool = False) -> dict[str, Any]:
    config: dict[str, Any] = {
        "cluster": {"k3s_version": "v1.36.1+k3s1"},
        "ssh": {"private_key_file": str(key_file)},
        "workers": [{"name": "metal-1", "kind": "existing", "address": "198.51.100.20", "labels": labels}],
    }
    if pool:
        config["workers"][0]["labels"] = {}
        config["worker_pools"] = [{"name": "web", "count": 1, "labels": labels}]
    return config


@pytest.mark.parametrize("key", KUBELET_REFUSES)
@pytest.mark.parametrize("pool", [False, True], ids=["worker", "pool"])
def test_a_label_the_kubelet_refuses_is_refused_naming_the_setting_and_the_fix(
    ssh_key_file: Path, key: str, pool: bool
) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(_config(ssh_key_file, {key: "x"}, pool=pool))
    setting = "hk3s:worker_pools[0].labels" if pool else "hk3s:workers[0].labels"
    messages = [problem.message for problem in caught.value.problems if problem.key == setting]
    assert messages, str(caught.value)
    assert any(key in m and "kubelet" in m and "use a domain of your own" in m for m in messages), messages


@pytest.mark.parametrize("key", KUBELET_TAKES)
def test_a_label_the_kubelet_takes_is_accepted(ssh_key_file: Path, key: str) -> None:
    settings = load_settings(_config(ssh_key_file, {key: "x"}))
    assert settings.workers[0].labels == {key: "x"}


def test_the_rule_is_the_kubelets() -> None:
    assert [key for key in KUBELET_REFUSES if not kubelet_refuses_label(key)] == []
    assert [key for key in KUBELET_TAKES if kubelet_refuses_label(key)] == []
    # The keys a kubelet sets itself are allowed by its rule (the program reserves some of them).
    assert not kubelet_refuses_label("kubernetes.io/hostname")
    assert kubelet_refuses_label("node-role.kubernetes.io/worker")
    assert kubelet_refuses_label("kubernetes.io/team")


def _agent(tmp_path: Path, name: str, labels: list[str]) -> subprocess.Popen[str]:
    data = tmp_path / name
    data.mkdir()
    args = [str(BIN / "k3s"), "agent", "--data-dir", str(data), "--node-name", name, "--token", "K10x::a.b"]
    # No server answers (the agent retries); its load balancer on a port of its own, not 6444.
    args += ["--server", f"https://127.0.0.1:{free_port()}", "--lb-server-port", str(free_port())]
    for label in labels:
        args += ["--node-label", f"{label}=x"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _stderr_until(agent: subprocess.Popen[str], marker: str, seconds: float) -> str:
    """The agent's log until it exits or prints `marker`, then the agent stopped."""
    assert agent.stderr is not None
    seen = ""
    deadline = time.monotonic() + seconds
    # A selector, not select.select: a test process that has opened many files before this one
    # holds descriptors past select()'s limit of 1024.
    watch = selectors.DefaultSelector()
    watch.register(agent.stderr, selectors.EVENT_READ)
    try:
        while marker not in seen and time.monotonic() < deadline:
            if watch.select(0.2):
                line = agent.stderr.readline()
                if not line and agent.poll() is not None:
                    break
                seen += line
    finally:
        watch.close()
        agent.terminate()
        agent.wait(10)
    return seen


@pytest.mark.lab
def test_the_stand_in_kubelet_agrees_with_the_settings_check(ssh_key_file: Path, tmp_path: Path) -> None:
    skip_without_lab_binaries("k3s")
    candidates = KUBELET_REFUSES + KUBELET_TAKES
    accepted = []
    for key in candidates:
        try:
            load_settings(_config(ssh_key_file, {key: "x"}))
        except SettingsError:
            continue
        accepted.append(key)

    # Every label the settings let through starts the kubelet: the agent goes on to its server.
    log = _stderr_until(_agent(tmp_path, "takes", accepted), "Failed to validate connection", 20)
    assert "labels specified with --node-labels" not in log, log
    assert "Failed to validate connection" in log, log

    refused = sorted(set(candidates) - set(accepted))
    log = _stderr_until(_agent(tmp_path, "refuses", refused), "\n", 20)
    assert f"unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{' '.join(refused)}]" in log, log
