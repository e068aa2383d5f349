"""The forward's fixed local port and the kubeconfig it hands the Kubernetes provider (the
forward itself runs over real SSH in tests/lab/test_join_firewalled.py)."""

from __future__ import annotations

import pytest

from remote_access.api_forward import FORWARD_PORT_COUNT, FORWARD_PORT_FIRST, forward_port, forwarded_kubeconfig

KUBECONFIG = """apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: Q0E=
    server: https://203.0.113.10:6443
  name: default
users:
- name: default
  user:
    client-certificate-data: Q0VSVA==
"""


def test_the_port_is_the_same_for_a_stack_and_differs_between_stacks() -> None:
    assert forward_port("hk3s", "dev") == forward_port("hk3s", "dev")
    ports = {forward_port("hk3s", stack) for stack in ("dev", "staging", "prod", "ci", "lab")}
    assert len(ports) == 5
    # Below Linux's ephemeral range, so no outgoing connection ever holds it.
    assert all(FORWARD_PORT_FIRST <= port < FORWARD_PORT_FIRST + FORWARD_PORT_COUNT < 32768 for port in ports)


def test_the_kubeconfig_points_at_the_forward_and_keeps_ca_and_credentials() -> None:
    forwarded = forwarded_kubeconfig(KUBECONFIG, 17480)
    assert "    server: https://127.0.0.1:17480\n" in forwarded
    assert forwarded.replace("https://127.0.0.1:17480", "https://203.0.113.10:6443") == KUBECONFIG
    with pytest.raises(ValueError, match="names no https server"):
        forwarded_kubeconfig("apiVersion: v1\n", 17480)
