"""The host checks' verdicts from the facts host_scripts/host_health.sh prints (the
script itself runs on lab hosts in tests/lab/test_teardown.py)."""

from __future__ import annotations

from node_operations.health import judge, live_state
from remote_access.kube import NodeStatus, Taint

NOW = 1_800_000_000
HEALTHY = {
    "unit": "k3s-agent",
    "active": "active",
    "disk_free_percent:/": "62",
    "disk_free_percent:/var/lib/rancher": "62",
    "time_synced": "yes",
    "cert_expires_epoch": str(NOW + 200 * 86400),
    "now_epoch": str(NOW),
}


def test_a_healthy_node_has_no_warning() -> None:
    health = judge("w1", dict(HEALTHY))
    assert health.warnings == ()
    assert health.k3s_active is True and health.time_synced is True and health.cert_expires_in_days == 200
    assert health.disk_free_percent == {"/": 62, "/var/lib/rancher": 62}


def test_each_finding_is_one_warning_naming_the_node_and_what_to_do() -> None:
    facts = {
        **HEALTHY,
        "active": "failed",
        "disk_free_percent:/var/lib/rancher": "7",
        "time_synced": "no",
        "cert_expires_epoch": str(NOW + 12 * 86400 + 5),
    }
    warnings = judge("w1", facts).warnings
    assert len(warnings) == 4, warnings
    assert warnings[0] == "w1: k3s-agent is failed; see journalctl -u k3s-agent"
    assert "only 7% of /var/lib/rancher is free" in warnings[1]
    assert "clock is not synchronised" in warnings[2]
    assert "expires in 12 days; reboot it" in warnings[3]


def test_a_node_without_k3s_or_facts_says_so() -> None:
    health = judge("w2", {"time_synced": "unknown", "now_epoch": str(NOW)})
    assert health.warnings == ("w2: no k3s unit is installed (neither k3s nor k3s-agent)",)
    assert health.time_synced is None and health.cert_expires_in_days is None


def _node(ready: bool, *, cordoned: bool = False, taints: list[Taint] | None = None) -> NodeStatus:
    return NodeStatus(name="w1", ready=ready, unschedulable=cordoned, taints=taints or [])


def test_the_live_state_names_ready_notready_cordoned_outofservice_and_missing() -> None:
    assert live_state(_node(True)) == "Ready"
    assert live_state(_node(False)) == "NotReady"
    assert live_state(_node(True, cordoned=True)) == "Ready,cordoned"
    assert live_state(_node(False, cordoned=True)) == "NotReady,cordoned"
    # A fenced node never counts as Ready, whatever its condition says.
    fenced = [Taint("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute")]
    assert live_state(_node(True, taints=fenced)) == "OutOfService"
    assert live_state(_node(False, cordoned=True, taints=fenced)) == "OutOfService"
    # Another taint with the same effect is not a fence.
    assert live_state(_node(True, taints=[Taint("dedicated", "web", "NoExecute")])) == "Ready"
    assert live_state(None) == "missing"


def test_a_node_with_the_fence_record_is_out_of_service_before_its_taint_and_until_the_lift_ends() -> None:
    # The fence writes its record first and the lift removes it last (the taint goes before the
    # lift's checks): a node carrying it is fenced, Ready or not.
    recorded = NodeStatus(name="w1", ready=True, annotations={"hk3s.dev/fenced-at": "2026-12-05T02:00:00Z"})
    assert live_state(recorded) == "OutOfService"


def test_the_server_certificates_warn_from_k3s_renewal_window_on() -> None:
    """k3s renews the server's certificates only at a start within 90 days of their end
    (deps.go): outside that window nothing is said, inside it the first to end is named with the
    fixes, and a day's rounding never hides one that ends within hours."""
    server = {**HEALTHY, "unit": "k3s", "server_cert_file": "client-admin.crt"}
    outside = judge("srv", {**server, "server_cert_expires_epoch": str(NOW + 90 * 86400)})
    assert outside.warnings == ()
    inside = judge("srv", {**server, "server_cert_expires_epoch": str(NOW + 90 * 86400 - 1)}).warnings
    assert len(inside) == 1 and inside[0].startswith(
        "srv: the k3s server's certificate client-admin.crt expires in 89 days"
    )
    assert "k3s certificate rotate" in inside[0] and "approve_server_restart: true" in inside[0]
    hours = judge("srv", {**server, "server_cert_expires_epoch": str(NOW + 3 * 3600 - 5)}).warnings
    assert "client-admin.crt expires in 2 hours" in hours[0]
    gone = judge("srv", {**server, "server_cert_expires_epoch": str(NOW - 1)}).warnings
    assert "client-admin.crt expired" in gone[0]
