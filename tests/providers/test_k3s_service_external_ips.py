"""A Service's externalIPs hijack node traffic (CVE-2020-8554): kube-proxy on every node sends
whatever is addressed to an external IP a Service names (the server's address on 6443 or 22,
say) to that Service's pods, and any user who may create a Service may name one. k3s enables
only NodeRestriction; the upstream mitigation is the DenyServiceExternalIPs admission plugin
(kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#denyserviceexternalips).
A new server starts with it; a running one gets it only with approval, since turning it on
restarts k3s (the API is down for 10-30 s). The provider's check decides it, no host involved;
tests/lab/test_teardown.py shows the real API server refusing such a Service."""

from __future__ import annotations

import yaml

from node_operations.health import judge
from node_operations.k3s_install import K3sBinary, ServerSpec, server_config
from providers.k3s_server import K3sServerProvider

SETTINGS = {"node": "srv", "k3s_version": "v1.35.2+k3s1", "approve_restart": False}
EARLIER = {"node": "srv", "k3s_version": "v1.35.2+k3s1", "approve_restart": False}


def test_a_new_server_starts_with_the_admission_plugin() -> None:
    checked = K3sServerProvider().check({}, dict(SETTINGS))
    assert checked.inputs["deny_service_external_ips"] is True
    assert not checked.failures


def test_a_running_server_without_it_keeps_running_unless_the_restart_is_approved() -> None:
    # An earlier release's server: its recorded inputs have no such key at all.
    checked = K3sServerProvider().check(EARLIER, dict(SETTINGS))
    assert not checked.inputs.get("deny_service_external_ips")
    assert not checked.failures
    assert not K3sServerProvider().diff("srv-k3s", EARLIER, checked.inputs).changes
    approved = K3sServerProvider().check(EARLIER, {**SETTINGS, "approve_restart": True})
    assert approved.inputs["deny_service_external_ips"] is True
    assert K3sServerProvider().diff("srv-k3s", EARLIER, approved.inputs).changes
    # Once on, it stays on without the approval.
    on = {**EARLIER, "deny_service_external_ips": True}
    assert K3sServerProvider().check(on, dict(SETTINGS)).inputs["deny_service_external_ips"] is True


def test_the_server_config_passes_the_plugin_to_the_api_server() -> None:
    spec = ServerSpec(
        node="srv",
        node_ip="10.0.1.2",
        external_ip="198.51.100.2",
        pod_cidr="10.42.0.0/16",
        service_cidr="10.43.0.0/16",
        flannel_backend="vxlan",
        binary=K3sBinary(version="v1.36.1+k3s1"),
        deny_service_external_ips=True,
    )
    config = yaml.safe_load(server_config(spec, "eth0"))
    # k3s replaces its own --enable-admission-plugins=NodeRestriction with the value given here
    # (k3s pkg/util/args.go GetArgs), so NodeRestriction must be named again.
    assert config["kube-apiserver-arg"] == ["enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs"]
    earlier = yaml.safe_load(server_config(ServerSpec(**{**spec.__dict__, "deny_service_external_ips": False}), "eth0"))
    assert "kube-apiserver-arg" not in earlier


def test_status_names_a_server_without_it_and_what_to_do() -> None:
    facts = {"unit": "k3s", "active": "active", "secrets_encryption": "yes", "deny_service_external_ips": "no"}
    warnings = judge("srv", facts).warnings
    assert len(warnings) == 1 and "accepts Services with externalIPs" in warnings[0], warnings
    assert "hk3s:network.approve_server_restart: true" in warnings[0]
    assert judge("srv", {**facts, "deny_service_external_ips": "yes"}).warnings == ()
