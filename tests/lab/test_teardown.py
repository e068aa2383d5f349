"""Tearing a stack down through the real engine, on booted lab hosts with the k3s
stand-in and a real Kubernetes API server. Nothing is mocked. The tests of this
module share one stack (a server and two workers) and run in order. td-w1 has no iptables
package (k3s then makes its rules with the iptables it bundles, lab/k3s_bundle.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pulumi import automation as auto

from lab.hosts import Host, Lab
from lab.k3s_bundle import BUNDLED_AUX_GLOB, remove_host_iptables
from lab.stack_harness import (
    CliRun,
    LabStack,
    base_config,
    k3s_snapshot,
    run_cli,
    server_spec,
    skip_without_lab_binaries,
    up_or_fail,
    worker_spec,
)
from node_operations.teardown import WipeError, wipe_node
from operator_api import ClusterStack, RefusedError
from tests.lab.test_host_firewall import ssh_target

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"
KUBELET_PORT = 10250


@dataclass
class Stack:
    lab: Lab
    server: Host
    w1: Host
    w2: Host
    outsider: Host
    stack: LabStack

    @property
    def nodes(self) -> list[Host]:
        return [self.server, self.w1, self.w2]

    def api(self) -> ClusterStack:
        return self.stack.api()

    def hk3s(self, *args: str) -> CliRun:
        return self.stack.hk3s(*args, timeout=300)

    def config(self, **cluster: Any) -> dict[str, Any]:
        config = base_config(self.lab, self.server, [self.w1, self.w2], firewall={"managed": True})
        config["cluster"].update(cluster)
        return config


SECRET_BEFORE = "/registry/secrets/default/before-the-stack"
ENCRYPTED = b"k8s:enc:aescbc:v1:"


def run_k3s_without_encryption(server: Host) -> None:
    """The server as its operator ran it before this stack existed: k3s started by hand, without
    secrets-encryption, holding a Secret (stored as it came: unencrypted)."""
    binary, _ = k3s_snapshot()
    (server.root / "usr/local/bin/k3s").write_bytes(binary.read_bytes())
    (server.root / "usr/local/bin/k3s").chmod(0o755)
    (server.root / "etc/rancher/k3s").mkdir(parents=True, exist_ok=True)
    (server.root / "etc/rancher/k3s/config.yaml").write_text(
        f"write-kubeconfig-mode: '0600'\nnode-ip: {server.public_ip}\n"
    )
    unit = "[Unit]\nDescription=k3s\n[Service]\nType=notify\nExecStart=/usr/local/bin/k3s server\nKillMode=process\n"
    (server.root / "etc/systemd/system/k3s.service").write_text(unit)
    server.run(["systemctl", "daemon-reload"])
    started = server.run(["systemctl", "start", "k3s"], timeout=300, check=False)
    journal = server.run(["journalctl", "-u", "k3s", "-n", "30", "--no-pager"], check=False).stdout
    assert started.returncode == 0, f"k3s did not start:\n{journal}"
    server.run(["sh", "-c", f"until {K3S} kubectl get --raw /readyz >/dev/null 2>&1; do sleep 1; done"], timeout=120)
    name = SECRET_BEFORE.rsplit("/", 1)[1]
    server.run([K3S, "kubectl", "create", "secret", "generic", name, "--from-literal=password=written-before"])
    assert stored_value(server, SECRET_BEFORE).find(b"written-before") >= 0


def stored_value(server: Host, key: str) -> bytes:
    """The newest value k3s's datastore (kine on SQLite) holds for `key`, as stored on disk."""
    db = server.root / "var/lib/rancher/k3s/server/db/state.db"
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        row = conn.execute("SELECT value FROM kine WHERE name = ? ORDER BY id DESC LIMIT 1", (key,)).fetchone()
    assert row is not None, f"{key} is not in the datastore"
    return bytes(row[0])


@pytest.fixture(scope="module")
def teardown_stack(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("td-server"))
    w1, w2 = lab.add_host(worker_spec("td-w1")), lab.add_host(worker_spec("td-w2"))
    outsider = lab.add_host(worker_spec("td-outsider"))  # not in the stack: probes from outside
    lab.wait_ssh_ready([server, w1, w2, outsider])
    remove_host_iptables(w1)  # before k3s is installed: a host installed without iptables
    # The stack adopts a server that already runs k3s (without secrets-encryption).
    run_k3s_without_encryption(server)
    stack = Stack(lab, server, w1, w2, outsider, LabStack(tmp_path_factory.mktemp("teardown-stack")))
    stack.stack.write_config(stack.config())
    up_or_fail(stack.stack)
    yield stack


def reaches(source: Host, target: Host, port: int) -> bool:
    """A real TCP connection attempt from one host to another's port."""
    assert target.public_ip
    probe = f"timeout 3 bash -c '</dev/tcp/{target.public_ip}/{port}'"
    return source.run(["sh", "-c", probe], check=False).returncode == 0


def host_state(host: Host) -> str:
    """k3s's binary, config, unit start time and the program's firewall table, as on the host."""
    script = (
        f"sha256sum {K3S} /etc/rancher/k3s/config.yaml 2>/dev/null; "
        "systemctl show k3s k3s-agent -p ActiveState -p ActiveEnterTimestamp; "
        "nft list table inet hk3s_node 2>/dev/null | sha256sum"
    )
    return host.run(["sh", "-c", script]).stdout


# The controller manager's root-ca-cert-publisher writes this ConfigMap into every namespace on
# its own schedule (later under load): its coming is Kubernetes' doing, never the program's.
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"


def cluster_objects(server: Host) -> list[str]:
    out = server.run([K3S, "kubectl", "get", "nodes,namespaces,secrets,configmaps", "-A", "-o", "json"]).stdout
    return sorted(
        f"{i['kind']}/{i['metadata'].get('namespace', '')}/{i['metadata']['name']}"
        for i in json.loads(out)["items"]
        if not (i["kind"] == "ConfigMap" and i["metadata"]["name"] == ROOT_CA_CONFIGMAP)
    )


def snapshot(stack: Stack) -> dict[str, Any]:
    return {
        "hosts": {h.name: host_state(h) for h in stack.nodes},
        "objects": cluster_objects(stack.server),
        "ports": {
            "w2->w1 kubelet": reaches(stack.w2, stack.w1, KUBELET_PORT),
            "outsider->w1 kubelet": reaches(stack.outsider, stack.w1, KUBELET_PORT),
            "w1->server api": reaches(stack.w1, stack.server, 6443),
            "outsider->server api": reaches(stack.outsider, stack.server, 6443),
        },
    }


def resources_in_state(stack: LabStack) -> list[str]:
    deployment = stack.stack().export_stack().deployment
    return [r["type"] for r in (deployment or {}).get("resources", []) if r["type"] != "pulumi:pulumi:Stack"]


def test_an_adopted_server_has_secrets_encryption_and_its_old_secrets_reencrypted(teardown_stack: Stack) -> None:
    """k3s turns secrets-encryption on at a start with the flag (deps.go genEncryptionConfigAndState),
    and Secrets stored before stay unencrypted until rewritten. The adopted server's Secret from
    before the stack is encrypted in the datastore itself once the run is done, the run said so,
    and k3s reports the re-encryption finished."""
    server = teardown_stack.server
    value = stored_value(server, SECRET_BEFORE)
    assert value.startswith(ENCRYPTED) and b"written-before" not in value, value[:60]
    status = server.run([K3S, "secrets-encrypt", "status"]).stdout
    assert "Encryption Status: Enabled" in status and "Current Rotation Stage: reencrypt_finished" in status, status
    assert "Secrets re-encrypted" in teardown_stack.stack.text()
    # A Secret written now is encrypted as it is stored.
    server.run([K3S, "kubectl", "create", "secret", "generic", "after-the-stack", "--from-literal=password=x"])
    assert stored_value(server, "/registry/secrets/default/after-the-stack").startswith(ENCRYPTED)


def test_status_checks_every_host_over_ssh(teardown_stack: Stack) -> None:
    """`status(check_hosts=True)` reads each node's health over SSH, read-only, and names
    what is wrong: a stopped agent, a certificate close to expiry, a host it cannot reach."""
    api, w1, w2 = teardown_stack.api(), teardown_stack.w1, teardown_stack.w2
    before = snapshot(teardown_stack)
    first = api.status(check_hosts=True)
    checks = {c.node: c for c in first.host_checks}
    assert sorted(checks) == ["td-server", "td-w1", "td-w2"]
    assert checks["td-server"].k3s_unit == "k3s" and checks["td-w1"].k3s_unit == "k3s-agent"
    for check in checks.values():
        assert check.reachable and check.k3s_active, check
        assert check.cert_expires_in_days is not None and 300 < check.cert_expires_in_days <= 366, check
        assert 0 < check.disk_free_percent["/"] <= 100, check
    assert snapshot(teardown_stack) == before  # read-only
    # The stack's server (adopted; its Secrets from before re-encrypted by the run, the test
    # above) has its Secrets encrypted at rest: nothing to warn of.
    config = teardown_stack.server.root / "etc/rancher/k3s/config.yaml"
    assert "\nsecrets-encryption: true\n" in config.read_text()
    assert not [w for w in first.warnings if "unencrypted" in w], first.warnings

    cert = "/var/lib/rancher/k3s/agent/client-kubelet.crt"
    w1.run(["cp", "-p", cert, "/root/client-kubelet.crt.kept"])
    w1.run(
        f"openssl req -x509 -newkey rsa:2048 -days 12 -nodes -subj /CN=short -keyout /root/short.key -out {cert}",
        timeout=60,
    )
    w1.run(["systemctl", "stop", "k3s-agent"])
    w2.power_off()
    # As a server that runs without secrets-encryption reads: k3s finds no encryption configuration
    # (its status reads the file at each request; the running API server keeps what it loaded).
    encryption = "/var/lib/rancher/k3s/server/cred/encryption-config.json"
    teardown_stack.server.run(["mv", encryption, f"{encryption}.kept"])
    try:
        status = api.status(check_hosts=True)
    finally:
        teardown_stack.server.run(["mv", f"{encryption}.kept", encryption])
        # Both hosts are put back whatever happens, so the module's later tests find the cluster
        # as it was: the agent's start is not waited on here (under load its first start may
        # fail; the unit's Restart=always starts it again), the loop below waits for it.
        try:
            w1.run(["cp", "-p", "/root/client-kubelet.crt.kept", cert])
            w1.run(["systemctl", "start", "--no-block", "k3s-agent"])
        finally:
            w2.power_on(wait=True)
    warnings = "\n".join(status.warnings)
    assert "td-w1: k3s-agent is inactive; see journalctl -u k3s-agent" in warnings, warnings
    assert "td-w1: its k3s client certificate expires in 11 days; reboot it" in warnings, warnings
    assert "td-w2: could not be checked" in warnings, warnings
    assert "td-server: Kubernetes Secrets are stored unencrypted in k3s's datastore" in warnings, warnings
    assert "(k3s secrets-encrypt status: Disabled)" in warnings and "approve_server_restart: true" in warnings
    assert not [
        w for w in status.warnings if w.startswith("td-server") and "clock" not in w and "unencrypted" not in w
    ], warnings
    # The CLI shows the same, as a table and the warnings.
    cli = teardown_stack.hk3s("status", "--check")
    assert cli.returncode == 0 and "CERT EXPIRES" in cli.stdout, cli.stdout + cli.stderr
    for name in ("td-server", "td-w1", "td-w2"):
        assert name in cli.stdout.split("CERT EXPIRES", 1)[1]
    # The cluster is as it was once the agent is back.
    deadline = time.monotonic() + 120
    while snapshot(teardown_stack)["ports"] != before["ports"]:
        if time.monotonic() > deadline:
            journal = w1.run(["journalctl", "-u", "k3s-agent", "-n", "40", "--no-pager"], check=False).stdout
            pytest.fail(f"the restarted worker did not come back; its agent's journal:\n{journal}")
        time.sleep(2)


HIJACK_SERVICE = """apiVersion: v1
kind: Service
metadata:
  name: hijack
  namespace: default
spec:
  selector:
    app: hijack
  ports:
    - {{name: ssh, port: 22, targetPort: 2222}}
    - {{name: api, port: 6443, targetPort: 6443}}
{external}"""


def test_the_api_server_refuses_a_service_whose_external_ips_would_take_the_servers_ports(
    teardown_stack: Stack,
) -> None:
    """CVE-2020-8554: kube-proxy on every node sends what is addressed to a Service's externalIPs
    to that Service's pods, so a user who may create Services could take the server's 22 and 6443
    from the agents and the program. The program's server config passes DenyServiceExternalIPs
    through kube-apiserver-arg; k3s gives it to the API server in place of its own
    --enable-admission-plugins=NodeRestriction (k3s pkg/util/args.go GetArgs, which the stand-in
    follows), and the refusal here is the real kube-apiserver's admission plugin
    (plugin/pkg/admission/network/denyserviceexternalips)."""
    server = teardown_stack.server
    config = (server.root / "etc/rancher/k3s/config.yaml").read_text()
    assert "\nkube-apiserver-arg:\n- enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs\n" in config
    running = server.run(["pgrep", "-a", "kube-apiserver"]).stdout
    assert running.count("--enable-admission-plugins=") == 1, running
    assert "--enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs" in running, running
    addresses = [str(address) for address in (server.public_ip, server.private_ip) if address]
    external = "  externalIPs:\n" + "".join(f"    - {address}\n" for address in addresses)
    manifest = server.root / "root/hijack.yaml"
    manifest.write_text(HIJACK_SERVICE.format(external=external))
    refused = server.run([K3S, "kubectl", "create", "-f", "/root/hijack.yaml"], check=False)
    assert refused.returncode != 0, refused.stdout
    assert "Use of external IPs is denied by admission control" in refused.stderr, refused.stderr
    # The same Service without them is admitted, and adding them later is refused too.
    manifest.write_text(HIJACK_SERVICE.format(external=""))
    try:
        server.run([K3S, "kubectl", "create", "-f", "/root/hijack.yaml"])
        patch = json.dumps({"spec": {"externalIPs": [addresses[0]]}})
        patched = server.run([K3S, "kubectl", "patch", "service", "hijack", "-p", patch], check=False)
        assert patched.returncode != 0 and "denied by admission control" in patched.stderr, patched.stderr
        kept = server.run([K3S, "kubectl", "get", "service", "hijack", "-o", "jsonpath={.spec.externalIPs}"])
        assert kept.stdout == "", kept.stdout
    finally:
        server.run([K3S, "kubectl", "delete", "service", "hijack", "--ignore-not-found"], check=False)


def test_destroy_is_refused_without_the_setting_and_changes_nothing(teardown_stack: Stack) -> None:
    before = snapshot(teardown_stack)
    assert before["ports"] == {
        "w2->w1 kubelet": True,
        "outsider->w1 kubelet": False,
        "w1->server api": True,
        "outsider->server api": False,
    }
    count = len(resources_in_state(teardown_stack.stack))
    # What a destroy would delete, per host, without deleting anything.
    planned = run_cli(teardown_stack.stack, ["destroy", "--preview-only"])
    assert planned.returncode == 0, planned.output[-3000:]
    for resource in ("td-server-k3s", "td-w1-join", "td-w2-join", "td-w1-firewall", "teardown-guard"):
        assert resource in planned.output, planned.output[-3000:]
    assert f"- {count} to delete" in planned.output, planned.output[-1500:]
    with pytest.raises(auto.CommandError):
        teardown_stack.stack.destroy()
    text = teardown_stack.stack.text()
    refusal = "pulumi destroy is refused: hk3s:cluster.teardown is not 'allowed'. Nothing was changed"
    assert refusal in text, text[-3000:]
    assert "set hk3s:cluster.teardown: allowed and run pulumi up" in text
    assert "Traceback" not in text
    # The same through the operator API: a refusal, typed.
    with pytest.raises(RefusedError) as refused:
        teardown_stack.api().destroy_stack(confirm="lab")
    assert refused.value.reason == "teardown", refused.value
    assert snapshot(teardown_stack) == before
    assert len(resources_in_state(teardown_stack.stack)) == count


def test_allowing_the_teardown_changes_nothing_on_any_host(teardown_stack: Stack) -> None:
    before = snapshot(teardown_stack)
    teardown_stack.stack.write_config(teardown_stack.config(teardown="allowed"))
    result = up_or_fail(teardown_stack.stack)
    changes = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert changes.get("update", 0) >= 4 and not changes.get("replace") and not changes.get("create"), changes
    text = teardown_stack.stack.text()
    for worker in ("td-w1", "td-w2"):
        assert f"[{worker}] preflight" not in text.split("Updating (")[-1]  # no rejoin
    assert snapshot(teardown_stack) == before


KUBE_CHAIN = ":KUBE-POSTROUTING"
# k3s's chains in the host's ruleset, whichever iptables made them: iptables-nft's chains are
# nftables chains of the same names, so nft sees them on a host without any iptables tool.
NFT_K3S_CHAINS = "nft list ruleset | grep -E '^[[:space:]]*chain (KUBE-|CNI-|FLANNEL-)'"


def xtables_save(host: Host, tool: str, table: str) -> str:
    """`<tool>-save -t <table>` with the host's tool, else k3s's bundled one (as k3s finds it:
    after the host's PATH)."""
    script = f'PATH="$PATH:$(echo {BUNDLED_AUX_GLOB} | tr " " :)" {tool}-save -t {table}'
    return host.run(["sh", "-c", script]).stdout


def test_a_host_without_iptables_gets_k3s_rules_from_k3s_bundled_copy(teardown_stack: Stack) -> None:
    """As k3s (cmd/k3s/main.go stageAndRun puts <data-dir>/data/<hash>/bin/aux at the end of its
    PATH): td-w1 has no iptables package, and its node components' chains are there all the
    same, made by the iptables k3s extracted into its data dir."""
    w1 = teardown_stack.w1
    assert w1.run(["sh", "-c", "command -v iptables-save"], check=False).returncode != 0
    chains = w1.run(["sh", "-c", NFT_K3S_CHAINS], check=False).stdout
    assert "KUBE-POSTROUTING" in chains and "FLANNEL-FWD" in chains, f"no k3s chains on {w1.name}: {chains!r}"
    bundled = w1.run(["sh", "-c", f"ls {BUNDLED_AUX_GLOB}/iptables-save"], check=False).stdout
    assert bundled.strip(), f"no bundled iptables-save under {BUNDLED_AUX_GLOB} on {w1.name}"


def test_destroy_with_the_setting_wipes_every_host_despite_a_kill_and_an_unreachable_worker(
    teardown_stack: Stack,
) -> None:
    stack, w2 = teardown_stack.stack, teardown_stack.w2
    # k3s's node components leave packet filter rules behind them (kube-proxy's, the kubelet's
    # and flannel's chains, on both address families), and kube-proxy's nftables mode its own
    # tables: the wipe removes them as k3s-killall.sh does. The stand-in makes the chains; the
    # nftables table is made here as kube-proxy's nftables mode names it (the stand-in runs
    # kube-proxy's iptables mode only). td-w1 has no iptables: its chains were made by k3s's
    # bundled copy, which only the wipe's use of that copy removes (it goes with k3s's data).
    for host in (teardown_stack.server, teardown_stack.w1):
        assert KUBE_CHAIN in xtables_save(host, "iptables", "nat"), host.name
        assert "FLANNEL-FWD" in xtables_save(host, "iptables", "filter"), host.name
        assert ":KUBE-KUBELET-CANARY" in xtables_save(host, "ip6tables", "mangle"), host.name
        host.run(["nft", "add table ip kube-proxy"])
    w2.power_off()  # unreachable for the whole teardown
    killed = run_cli(stack, ["destroy", "--yes", "--skip-preview"], kill_when="wiping k3s")
    assert killed.killed, killed.output[-3000:]
    assert run_cli(stack, ["cancel", "--yes"]).returncode == 0
    final = run_cli(stack, ["destroy", "--yes", "--skip-preview"])
    assert final.returncode == 0, final.output[-5000:]
    both = killed.output + final.output  # td-w2's turn may come before or after the kill
    assert "[td-w2] could not be reached" in both and "remove by hand on it" in both, both
    assert "interrupted while deleting" in final.output  # the resumed run finished what the killed one began
    assert resources_in_state(stack) == []
    for host in (teardown_stack.server, teardown_stack.w1):
        left = host.run(
            [
                "sh",
                "-c",
                f"ls -d {K3S} /var/lib/rancher/k3s /etc/rancher/k3s /var/lib/hk3s/journal "
                "/etc/systemd/system/k3s.service /etc/systemd/system/k3s-agent.service 2>/dev/null; "
                "pgrep -a k3s; nft list tables | grep -E 'hk3s|kube-proxy'; "
                "iptables-save | grep -E '^:(KUBE-|CNI-|FLANNEL-)|-j (KUBE-|CNI-|FLANNEL-)|flanneld'; "
                "ip6tables-save | grep -E '^:(KUBE-|CNI-|FLANNEL-)|-j (KUBE-|CNI-|FLANNEL-)|flanneld'; "
                f"{NFT_K3S_CHAINS}; nft list ruleset | grep -E 'flanneld|jump (KUBE-|CNI-|FLANNEL-)'",
            ],
            check=False,
        ).stdout
        assert left.strip() == "", f"{host.name} keeps: {left}"
    # A second destroy finds nothing to do.
    again = teardown_stack.api().destroy_stack(confirm="lab")
    assert not {op: n for op, n in again.summary.items() if op != "same"}, again.summary
    # The unreachable worker kept everything: a person finishes it (the message said what).
    w2.power_on(wait=True)
    assert w2.run(["test", "-e", K3S], check=False).returncode == 0


def test_a_wipe_that_cannot_remove_k3s_rules_fails_naming_them_and_keeps_k3s_data(teardown_stack: Stack) -> None:
    """A host whose k3s chains no iptables tool can remove (the host's package removed and no
    bundled copy of k3s's left: made here on a host outside the stack as iptables-nft makes them,
    chains of nftables' `ip filter` table) is not reported wiped: the wipe fails naming what is
    left and the fix, and stops before k3s's files go, so a run after the fix still has k3s's
    bundled tools. Another program's long ruleset follows k3s's chains (a table of 20000 chains,
    as on a busy host): the check must read a listing whole, since a search that stops at its
    first match (`nft list ruleset | grep -q` under pipefail) ends the lister with SIGPIPE and
    fails, and the leftover rules passed as none. A wipe that returned early without iptables
    tools reported success here too."""
    host = teardown_stack.outsider
    remove_host_iptables(host)
    kept = "/var/lib/rancher/k3s/agent/kept-until-the-rules-are-gone"
    host.run(
        [
            "sh",
            "-c",
            f"nft add table ip filter && nft add chain ip filter KUBE-LEFT-BEHIND && "
            "{ echo 'add table ip zz_filler'; for i in $(seq 20000); do echo \"add chain ip zz_filler f$i\"; done; } "
            "> /tmp/filler.nft && nft -f /tmp/filler.nft && rm /tmp/filler.nft && "
            f"mkdir -p {kept.rsplit('/', 1)[0]} && touch {kept}",
        ]
    )
    with pytest.raises(WipeError) as failed:
        asyncio.run(wipe_node(ssh_target(teardown_stack.lab, host), lambda _line: None))
    message = str(failed.value)
    assert "k3s packet filter rules still on the host after the wipe: nft-chains" in message, message
    assert "install iptables and run the wipe again" in message and "run the destroy again" in message, message
    assert host.run(["test", "-e", kept], check=False).returncode == 0, "the wipe removed k3s's files regardless"
    assert "chain KUBE-LEFT-BEHIND" in host.run(["nft", "list", "table", "ip", "filter"]).stdout
