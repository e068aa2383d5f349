"""The join's diagnoses from real k3s agent log lines."""

from __future__ import annotations

from node_operations.join import diagnose_agent_log

REJECTED = (
    'time="2026-12-03T05:48:24Z" level=info msg="Waiting to retrieve agent configuration; server is not ready: '
    "Node password rejected, duplicate hostname or contents of '/etc/rancher/node/password' may not match server "
    'node-passwd entry, try enabling a unique node name with the --with-node-id flag"'
)


def test_node_password_refusal_is_named_at_info_level() -> None:
    # k3s logs the refusal at info level, every 5 s: it must be found whatever the level.
    error = diagnose_agent_log("w2", ['level=info msg="Starting k3s agent"', REJECTED])
    assert error is not None and error.check == "node-password"
    assert str(error).startswith("w2: join stopped at node-password: the server refuses this host")
    assert "kubectl delete node" in str(error) and "another name in hk3s:workers" in str(error)


def test_a_rejected_token_is_named_in_old_and_new_k3s_wording() -> None:
    # Older k3s prints the HTTP status; newer decodes the server's Status object into its message.
    lines = [
        'level=error msg="Failed to validate connection to cluster at https://10.0.1.2:6443: failed to get CA certs: '
        'https://10.0.1.2:6443/cacerts: 401 Unauthorized"',
        'level=error msg="Failed to validate connection to cluster at https://10.0.1.2:6443: token is not authorized"',
        # What the agent logs for a refused token (pkg/agent/config/config.go's retry loop, info
        # level): before clientaccess decoded the supervisor's Status (seen up to v1.27.5) ...
        'level=info msg="Waiting to retrieve agent configuration; server is not ready: failed to retrieve '
        'configuration from server: https://127.0.0.1:6444/v1-k3s/config: 401 Unauthorized"',
        # ... and after (seen on v1.31.3): the Status message util.SendError wrote.
        'level=info msg="Waiting to retrieve agent configuration; server is not ready: failed to retrieve '
        'configuration from server: not authorized"',
    ]
    for line in lines:
        error = diagnose_agent_log("w3", [line])
        assert error is not None and error.check == "token", line
    assert diagnose_agent_log("w3", ['level=info msg="Starting k3s agent"']) is None
