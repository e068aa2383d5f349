"""The stack configuration as pydantic models.

Every field documents its default and why, because this is the configuration
reference: docs/configuration.md is generated from these models and a test keeps
the two in step. Rules that need two fields at once live in
``cluster_settings.rules``; rules about one value live here as validators.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from .defaults import DISK_SYNC_P99_DEFAULT_MS, DISK_SYNC_P99_MAX_MS, DISK_SYNC_P99_MIN_MS, VALIDATION_IMAGE_DEFAULT
from .values import (
    HETZNER_SPREAD_GROUP_MAX,
    HOSTNAME,
    SHA256_HEX,
    SSH_PUBLIC_KEY,
    HetznerServer,
    IPv4Addr,
    IPv4Cidr,
    K3sVersion,
    Labels,
    Location,
    NodeName,
    PoolName,
    Port,
    SshAddress,
    Taints,
    _node_name,
)

# An OCI image reference as containerd resolves it: lower-case name components, then a tag
# or a digest.
IMAGE_REFERENCE = re.compile(r"^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?(:[\w][\w.-]{0,127}|@sha256:[0-9a-f]{64})$")
# Bounds of hk3s:cluster.api_wait_seconds (see ClusterSettings).
API_WAIT_MIN = 5.0
API_WAIT_MAX = 3600.0


class StrictModel(BaseModel):
    """Unknown keys are errors: a misspelt setting must never be ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class ClusterSettings(StrictModel):
    """`hk3s:cluster`: what the whole cluster shares."""

    name: NodeName = Field(
        "k3s",
        description="Cluster name; prefixes the Hetzner resources (network, firewalls, SSH key).",
    )
    location: Location = Field(
        "fsn1",
        description="Default Hetzner location for servers the program creates (fsn1, nbg1, hel1, ash, hil, sin).",
    )
    server_type: str = Field(
        "cx33",
        min_length=1,
        description="Default Hetzner server type for servers the program creates (cx33: 4 vCPU, 8 GB; CX and CAX "
        "types are offered in the EU locations only). Checked against the location at preview.",
    )
    image: str = Field(
        "debian-12",
        min_length=1,
        description="Default Hetzner image for servers the program creates.",
    )
    k3s_version: K3sVersion = Field(
        ...,
        description="k3s release of the server, v1.30.0+k3s1 or later; every worker joins at exactly this "
        "version (e.g. v1.36.1+k3s1).",
    )
    k3s_binary: Path | None = Field(
        None,
        description="Air-gapped install: local path of the k3s binary to upload. Unset: the host downloads it.",
    )
    k3s_sha256: str | None = Field(
        None,
        description="SHA-256 of the k3s binary, checked on the host before it is installed. Required with k3s_binary.",
    )
    pod_cidr: IPv4Cidr = Field("10.42.0.0/16", description="Pod network (k3s --cluster-cidr).")
    service_cidr: IPv4Cidr = Field("10.43.0.0/16", description="Service network (k3s --service-cidr).")
    pod_network: Literal["wireguard", "vxlan"] = Field(
        "wireguard",
        description="Pod traffic between nodes: wireguard (encrypted, 51820/udp) or vxlan (8472/udp, unencrypted: "
        "refused in network mode public). Fixed once the cluster runs: a change is refused at preview.",
    )
    # vxlan sends pod traffic unencrypted into flannel.1, which every firewall backend trusts, on a port
    # guarded only by the (spoofable) source address: over public addresses that is the internet. Only
    # a network whose "public" addresses are no internet (the lab's bridge) may say so.
    vxlan_over_public_addresses: Literal["refused", "allowed"] = Field(
        "refused",
        description="allowed: pod_network vxlan may run in network mode public, sending pod traffic unencrypted "
        "between the nodes' public addresses. Only where those addresses are on a network you trust, never "
        "across the internet (use pod_network wireguard, or network mode private).",
    )
    registry: str | None = Field(
        None,
        description="Cluster registry as host[:port]; the join checks every worker reaches it.",
    )
    # k3s enables Traefik and ServiceLB by default; ServiceLB publishes a LoadBalancer Service's
    # ports as hostPorts on every node, past the host firewall's input chain. Off unless asked for.
    ingress: bool = Field(
        False,
        description="Run k3s's Traefik ingress, published by ServiceLB on the server only, with 80/443/tcp open "
        "to every source there. False: k3s runs with Traefik and ServiceLB disabled and no node opens 80/443.",
    )
    # A k3s restart on the server takes the API away for 10-30 s, longer on small servers; the
    # default covers it with room. Shorter than API_WAIT_MIN would turn a routine restart into a
    # failed run; longer than API_WAIT_MAX would hide a server that is down behind a silent wait.
    api_forward_port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="The local port of the forward to the Kubernetes API through the server's SSH session "
        "(what the Kubernetes provider uses). Default: derived from the project and stack names, the same "
        "for every run of the stack.",
    )
    api_wait_seconds: float = Field(
        120.0,
        description="How long a Kubernetes API call waits for the API while it is away (a k3s restart on the "
        "server) before the run stops. 5-3600 s.",
    )

    # The join runs one pod on each new worker before it takes workloads. The default is the
    # busybox k3s's own air-gap image tarball carries (its local-path provisioner's helper),
    # so a node that imported k3s's images runs it without a registry.
    validation_image: str = Field(
        VALIDATION_IMAGE_DEFAULT,
        description="Image of the validation pod the join runs on each new worker (needs sh and echo). "
        "Pulled only when the node lacks it: on an air-gapped cluster, an image in k3s's air-gap images.",
    )

    # A teardown deletes every host's k3s and data and every Hetzner resource of the stack, with
    # no move of any copy (the data goes with the cluster). Like a cloud's deletion protection,
    # it is lifted by an ordinary `up` first, so a stray `pulumi destroy` changes nothing.
    teardown: Literal["refused", "allowed"] = Field(
        "refused",
        description="refused: pulumi destroy is refused before anything changes. allowed (then `up`, then "
        "`pulumi destroy --run-program`): the destroy wipes k3s, its data and the program's files and rules from "
        "every host and "
        "deletes the stack's Hetzner resources, lifting protect_control_plane (Pulumi's and Hetzner's protection, "
        "at that `up`); no volume's data is moved or kept.",
    )

    # A server lost for good (its host dead or rebuilt, k3s's data gone) leaves the stack's
    # in-cluster objects (Longhorn's release, namespace, settings, storage classes) with no API to
    # delete them through: pulumi-kubernetes refuses to delete a Helm release on an unreachable
    # cluster. Declaring the loss lets the teardown forget them instead; the program checks the
    # server really does not answer, so a server that is only slow is never mistaken for lost.
    control_plane_lost: bool = Field(
        False,
        description="Only with teardown: allowed. True declares the control plane's server lost for good: "
        "the program checks that neither its SSH nor (through it) its Kubernetes API answers, opens no "
        "forward, and the teardown forgets the stack's in-cluster objects (Longhorn's release and "
        "namespace, its settings, the storage classes) instead of deleting them through the API; every "
        "host and Hetzner resource is still wiped or deleted.",
    )

    # Kubernetes' documented upgrade procedure drains a node before its kubelet moves to a new
    # minor release (kubelet state such as the pod and CPU manager files may not carry over); a
    # patch release only swaps the binary. True keeps to that procedure at the cost of moving pods.
    drain_on_minor_upgrade: bool = Field(
        True,
        description="A k3s_version change to a new minor release cordons and drains each worker before its "
        "agent moves (PodDisruptionBudgets respected), and uncordons it once Ready at the new version. False: "
        "workers move in place, pods running, as for a patch release (which never drains).",
    )

    protect_control_plane: bool = Field(
        True,
        description="Protect the Hetzner server of the control plane, the private network and its subnet: "
        "pulumi destroy and any change that would delete them are refused, and Hetzner's own delete protection "
        "(and the server's rebuild protection) refuses a delete or rebuild from the Cloud Console or the hcloud CLI. "
        "Set false only for throw-away stacks.",
    )

    @property
    def teardown_allowed(self) -> bool:
        return self.teardown == "allowed"

    @property
    def control_plane_protected(self) -> bool:
        """Whether the server, network and subnet carry Pulumi's protect, and the server and network
        Hetzner's delete (and rebuild) protection; a teardown lifts both."""
        return self.protect_control_plane and not self.teardown_allowed

    @field_validator("api_wait_seconds")
    @classmethod
    def _api_wait(cls, value: float) -> float:
        if not API_WAIT_MIN <= value <= API_WAIT_MAX:
            raise ValueError(
                f"{value:g} s is outside {API_WAIT_MIN:g}-{API_WAIT_MAX:g} s: a k3s restart keeps the API away "
                "10-30 s (longer on small servers), so set about 120"
            )
        return value

    @field_validator("validation_image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not IMAGE_REFERENCE.match(value):
            raise ValueError(
                f"{value!r} is not an image reference: give registry/name:tag or name@sha256:digest, "
                "e.g. 'docker.io/rancher/mirrored-library-busybox:1.36.1'"
            )
        return value

    @field_validator("k3s_sha256")
    @classmethod
    def _sha256(cls, value: str | None) -> str | None:
        if value is not None and not SHA256_HEX.match(value.lower()):
            raise ValueError(f"{value!r} is not a SHA-256 hex digest (64 hex digits)")
        return value.lower() if value else value

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, _, port = value.rpartition(":") if ":" in value else (value, "", "")
        if not HOSTNAME.match(host) or (port and not (port.isdigit() and 0 < int(port) < 65536)):
            raise ValueError(f"{value!r} is not host[:port], e.g. 'registry.example.com:5000'")
        return value


class SshSettings(StrictModel):
    """`hk3s:ssh`: how the program logs in to every node."""

    user: str = Field(
        "root",
        min_length=1,
        description="Login user on every node: root (the program's host commands run without sudo).",
    )
    private_key_file: Path = Field(
        ...,
        description="Private key that logs in to every node; its .pub file is given to Hetzner servers.",
    )
    host_keys: dict[str, str] = Field(
        default_factory=dict,
        description="Recorded SSH host keys per node name ('ssh-ed25519 AAAA...'); a changed key is refused.",
    )
    previous_private_key_file: Path | None = Field(
        None,
        description="The key private_key_file replaced, for a rotation the state has no record of (a stack "
        "older than the rotation); otherwise the previous key is kept, encrypted, in the state.",
    )
    hetzner_key: str | None = Field(
        None,
        min_length=1,
        description="Name of an SSH key already in the Hetzner project to give new servers. Unset: a key with "
        "the public key's fingerprint is used if the project has one, else the program uploads it.",
    )
    connect_timeout_seconds: float = Field(15.0, gt=0, le=300, description="Deadline for opening one SSH connection.")
    first_contact_seconds: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="How long the first login to a host waits for SSH to answer and cloud-init to finish "
        "(a new Hetzner server boots for a while after its create action ends; nobody can say how long).",
    )
    # A first contact with no pinned key accepts whatever key answers. A person at `pulumi up` sees
    # the key printed; in CI and through the operator API and CLI nobody does, so there it is refused.
    trust_on_first_use: bool = Field(
        False,
        description="In a non-interactive run (CI, the operator API and CLI, any run with CI or "
        "HK3S_NON_INTERACTIVE set, any run whose `pulumi` has no terminal on stdin), record the SSH host key of "
        "a host with none pinned on first contact "
        "instead of refusing the run. Every key recorded that way is listed in the run's result. Hetzner "
        "servers the program creates get their keys from it and are pinned from the start.",
    )

    @field_validator("user")
    @classmethod
    def _root_only(cls, value: str) -> str:
        if value != "root":
            raise ValueError(
                f"{value!r} is not root: the program's host commands (firewall, k3s, sshd) run without sudo, "
                "so log in as root with a key (hk3s:ssh.user: root)"
            )
        return value

    @field_validator("host_keys")
    @classmethod
    def _host_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for node, key in value.items():
            _node_name(node)
            if not SSH_PUBLIC_KEY.match(key.strip()):
                raise ValueError(
                    f"host key of {node!r} is not an OpenSSH public key line "
                    "('ssh-ed25519 AAAA...', as ssh-keyscan prints it without the host)"
                )
        return value


class NetworkSettings(StrictModel):
    """`hk3s:network`: the network the nodes use to talk to each other."""

    mode: Literal["auto", "private", "public"] = Field(
        "auto",
        description="auto: private when the hosts share a private IPv4 network, else public. The first join fixes it.",
    )
    private_network_cidr: IPv4Cidr = Field(
        "10.0.0.0/16", description="Hetzner Cloud network the program creates for its servers."
    )
    private_subnet_cidr: IPv4Cidr = Field(
        "10.0.1.0/24", description="Subnet of that network the servers are attached to."
    )
    private_network: IPv4Cidr | None = Field(
        None,
        description="Explicit private network; required when the private network carries the hosts' default route.",
    )
    approve_server_restart: bool = Field(
        False,
        description="Allow moving the server into the chosen mode, which restarts k3s (the API is down 10-30 s).",
    )


class FirewallSettings(StrictModel):
    """`hk3s:firewall`: host firewalls and the Hetzner cloud firewall."""

    managed: bool = Field(
        True,
        description="The program runs each node's host firewall (UFW, firewalld or nftables). False: you do.",
    )
    cloud_firewall: bool = Field(True, description="Create Hetzner cloud firewalls for the servers it creates.")
    operator_access: list[IPv4Cidr] = Field(
        default_factory=list,
        description="Networks allowed to reach the Kubernetes API (6443/tcp) from outside the cluster.",
    )
    nodeports_open: bool = Field(False, description="Open NodePorts (30000-32767) to every source.")
    # A node whose firewall the operator runs and that runs none at all leaves every port it
    # listens on (the kubelet's, 8888/tcp, NodePorts) open to whoever reaches it: the join
    # refuses it unless the stack says so, for a network another layer filters.
    none_acknowledged: bool = Field(
        False,
        description="Accept nodes whose firewall you run (managed false, or a worker's firewall false) with no "
        "active host firewall at all; every port they listen on is then open to whoever reaches them. Unset: the "
        "join refuses such a node, naming it.",
    )


# A Kubernetes namespace name: an RFC 1123 label.
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class StorageSettings(StrictModel):
    """`hk3s:storage`: Longhorn and how many copies of data it may keep."""

    max_copies: int = Field(1, description="Most copies of a volume offered: 1 or 2.")
    install_longhorn: bool = Field(True, description="Install Longhorn with the program's settings.")
    longhorn_version: str = Field("1.9.1", min_length=1, description="Longhorn Helm chart version.")
    longhorn_chart: Path | None = Field(
        None,
        description="Air-gapped install: local path of Longhorn's Helm chart at longhorn_version (a chart folder or "
        "a packaged .tgz). Unset: the chart is fetched from https://charts.longhorn.io.",
    )
    reserved_percent: int = Field(
        30, ge=0, le=90, description="Share of each default disk Longhorn never schedules on."
    )
    minimal_available_percent: int = Field(
        25, ge=0, le=90, description="A new copy needs more than this share of the disk available."
    )
    # A copy on a disk that syncs slowly slows every write to its volume: Longhorn acknowledges
    # a write once every copy has it. The disk probe holds the same bar etcd holds its own WAL to.
    disk_sync_p99_ms: float = Field(
        DISK_SYNC_P99_DEFAULT_MS,
        description="A worker holds volume copies only when the 99th percentile of its Longhorn disk's sync time "
        "(2300-byte writes, each followed by fdatasync) is at most this many ms; 0.5-1000. Default 10: etcd's "
        "documented guidance that the 99th percentile of its WAL fdatasync stay under 10 ms (measured with fio's "
        "2300-byte synced writes).",
    )

    longhorn_api_clients: list[str] = Field(
        default_factory=list,
        description="Namespaces whose pods may reach Longhorn's manager API (9500) and UI besides Longhorn's own "
        "pods, e.g. your monitoring's. Longhorn's API and UI have no authentication: every other pod is kept out "
        "by NetworkPolicies the program keeps in longhorn-system.",
    )

    @field_validator("longhorn_api_clients")
    @classmethod
    def _api_clients(cls, value: list[str]) -> list[str]:
        for name in value:
            if not NAMESPACE_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a namespace name (lower-case letters, digits and '-', at most 63, starting "
                    "and ending with a letter or digit); list the namespaces whose pods may reach Longhorn's API"
                )
        return sorted(set(value))

    @field_validator("disk_sync_p99_ms")
    @classmethod
    def _disk_sync(cls, value: float) -> float:
        if not DISK_SYNC_P99_MIN_MS <= value <= DISK_SYNC_P99_MAX_MS:
            raise ValueError(
                f"{value:g} ms is outside {DISK_SYNC_P99_MIN_MS:g}-{DISK_SYNC_P99_MAX_MS:g} ms: a local SSD syncs a "
                "small write in well under 1 ms and a disk over 1000 ms stalls every volume; keep the default 10 "
                "(etcd's guidance) or set a value in that range"
            )
        return value

    @field_validator("max_copies")
    @classmethod
    def _copies(cls, value: int) -> int:
        if value not in (1, 2):
            raise ValueError(
                f"{value} copies are not offered; set 1 (default) or 2 — "
                "two copies on different nodes is the most this release keeps"
            )
        return value


class HostSettings(StrictModel):
    """A machine of the cluster: a Hetzner server to create, or an existing host."""

    name: NodeName = Field(..., description="Node name in Kubernetes and Hetzner.")
    kind: Literal["hetzner", "existing"] = Field(
        "hetzner", description="hetzner: the program creates the server. existing: a host given by address."
    )
    server_type: str | None = Field(
        None, description="Hetzner server type (kind hetzner); default cluster.server_type."
    )
    image: str | None = Field(None, description="Hetzner image (kind hetzner); default cluster.image.")
    location: Location | None = Field(None, description="Hetzner location (kind hetzner); default cluster.location.")
    address: IPv4Addr | None = Field(None, description="Public IPv4 address (kind existing: required).")
    ssh_address: SshAddress | None = Field(None, description="Where SSH reaches the host, if not at address.")
    ssh_port: Port = Field(22, description="SSH port of the host.")
    private_address: IPv4Addr | None = Field(
        None, description="The host's address on the private network (kind existing), if it has one."
    )


class ServerSettings(HostSettings):
    """`hk3s:server`: the k3s server, the cluster's only control plane."""

    name: NodeName = Field("k3s-server", description="Node name of the server.")


class WorkerSettings(HostSettings):
    """One entry of `hk3s:workers`, or one worker of a pool in `hk3s:worker_pools`."""

    pool: PoolName | None = Field(
        None,
        description="A pool of hk3s:worker_pools whose labels, taints and settings this worker takes; "
        "its own fields win.",
    )
    holds_copies: bool = Field(True, description="False opts the worker out of holding volume copies (no disk check).")
    hcloud_server: HetznerServer | None = Field(
        None,
        description="kind existing: the Hetzner server this host is (its id or name), so a fence powers it off "
        "through the Hetzner API (hcloud:token) with no powered_off confirmation.",
    )
    ignore_slow_disk: bool = Field(
        False,
        description="Let the worker hold copies on a disk over storage.disk_sync_p99_ms (recorded as an override), "
        "unless one sync stalled for half of Longhorn's replica timeout (4 of engine-replica-timeout's 8 s) or more.",
    )
    firewall: bool | None = Field(
        None, description="Override firewall.managed for this node: true, false, or unset to follow it."
    )
    labels: Labels = Field(
        default_factory=dict,
        description="Extra node labels; none in kubernetes.io or k8s.io (or a subdomain) except those "
        "the kubelet takes (under node.kubernetes.io/, kubelet.kubernetes.io/).",
    )
    taints: Taints = Field(
        default_factory=list,
        description="Node taints, key=value:Effect or key:Effect (NoSchedule, PreferNoSchedule, NoExecute); "
        "given at registration, before any pod can land.",
    )


class PoolSettings(StrictModel):
    """One entry of `hk3s:worker_pools`: Hetzner servers named `<pool>-<n>`, as many as `count`."""

    name: PoolName = Field(..., description="Pool name; its workers are <name>-1, <name>-2, ...")
    count: int = Field(0, ge=0, description="How many workers the pool has; lowering it removes the highest numbers.")
    retire: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list,
        description="Worker numbers the pool does not use: lowering count with a number here removes that "
        "worker instead of the highest-numbered one.",
    )
    server_type: str | None = Field(None, description="Hetzner server type; default cluster.server_type.")
    image: str | None = Field(None, description="Hetzner image; default cluster.image.")
    locations: list[Location] = Field(
        default_factory=list,
        description="Hetzner locations the workers are spread over (worker n in the (n-1) mod len-th); "
        "default [cluster.location].",
    )
    labels: Labels = Field(
        default_factory=dict, description="Node labels of every worker of the pool (keys as a worker's labels)."
    )
    taints: Taints = Field(default_factory=list, description="Node taints of every worker of the pool.")
    holds_copies: bool = Field(True, description="False: the pool's workers hold no volume copies.")
    ignore_slow_disk: bool = Field(False, description="As for a worker, for every worker of the pool.")
    firewall: bool | None = Field(None, description="Override firewall.managed for the pool's workers.")
    placement: bool = Field(
        True,
        description="Spread the pool's workers over Hetzner hosts: one spread placement group per location "
        "for every 10 workers (Hetzner's limit).",
    )

    @field_validator("retire")
    @classmethod
    def _retire(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError("a worker number is listed twice; list each once")
        return value

    def numbers(self) -> list[int]:
        """The numbers of the pool's workers: the first `count` not retired."""
        numbers: list[int] = []
        candidate = 1
        retired = set(self.retire)
        while len(numbers) < self.count:
            if candidate not in retired:
                numbers.append(candidate)
            candidate += 1
        return numbers

    def worker_name(self, number: int) -> str:
        return f"{self.name}-{number}"


class FenceSettings(StrictModel):
    """One entry of `hk3s:fences`: a worker that is down and must be fenced."""

    powered_off: bool = Field(
        False,
        description="Confirms the host is powered off and stays off until it rejoins (needed when SSH fails).",
    )
    accept_stale_data: bool = Field(
        False, description="Let services start from copies that may be older than the lost one."
    )
    force_remove: bool = Field(
        False,
        description=(
            "Give the fenced worker up: with the worker dropped from hk3s:workers, deregister it (Node, "
            "Longhorn node, firewall peers) without a drain (CLI: node remove NAME --force)."
        ),
    )


@dataclass(frozen=True)
class PoolMember:
    """Where a pool's worker sits: its pool, number, location and spread placement group."""

    pool: str
    number: int
    location: str
    # "<pool>-<location>-<k>": the k-th group of the pool in that location, or None without placement.
    placement_group: str | None


def _member_of(pool: PoolSettings, number: int, default_location: str) -> PoolMember:
    locations = pool.locations or [default_location]
    location = locations[(number - 1) % len(locations)]
    # Numbers are dealt to locations in turn, so the ordinal within its location follows from the
    # number alone: groups fill to Hetzner's limit of 10 and a worker's group never moves when
    # others are retired or added.
    ordinal = (number - 1) // len(locations)
    group = f"{pool.name}-{location}-{ordinal // HETZNER_SPREAD_GROUP_MAX + 1}" if pool.placement else None
    return PoolMember(pool.name, number, location, group)


# A pool's settings an entry of hk3s:workers takes with `pool:` when it does not set them itself
# (labels merge, the worker's own keys winning); the Hetzner ones only for a Hetzner server.
_POOL_FIELDS = ("labels", "taints", "holds_copies", "ignore_slow_disk", "firewall")
_POOL_HETZNER_FIELDS = ("server_type", "image")


class StackSettings(StrictModel):
    """The whole stack configuration (namespace `hk3s`)."""

    cluster: ClusterSettings
    server: ServerSettings = Field(default_factory=ServerSettings)
    ssh: SshSettings
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    firewall: FirewallSettings = Field(default_factory=FirewallSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    workers: list[WorkerSettings] = Field(default_factory=list)
    worker_pools: list[PoolSettings] = Field(default_factory=list)
    fences: dict[str, FenceSettings] = Field(default_factory=dict)

    # Every worker as the cluster runs it (the entries of `workers` with their pool's settings,
    # then each pool's workers), each with the config key it comes from; built once.
    _resolved: list[tuple[WorkerSettings, str, PoolMember | None]] = PrivateAttr(default_factory=list)

    def model_post_init(self, context: object, /) -> None:
        pools = {pool.name: pool for pool in self.worker_pools}
        resolved: list[tuple[WorkerSettings, str, PoolMember | None]] = []
        for index, worker in enumerate(self.workers):
            pool = pools.get(worker.pool) if worker.pool else None
            resolved.append((_with_pool(worker, pool) if pool else worker, f"hk3s:workers[{index}]", None))
        for index, pool in enumerate(self.worker_pools):
            for number in pool.numbers():
                member = _member_of(pool, number, self.cluster.location)
                worker = WorkerSettings(
                    name=pool.worker_name(number),
                    pool=pool.name,
                    server_type=pool.server_type,
                    image=pool.image,
                    location=member.location,
                    labels=dict(pool.labels),
                    taints=list(pool.taints),
                    holds_copies=pool.holds_copies,
                    ignore_slow_disk=pool.ignore_slow_disk,
                    firewall=pool.firewall,
                )
                resolved.append((worker, f"hk3s:worker_pools[{index}]", member))
        self._resolved = resolved

    def fenced_workers(self) -> list[str]:
        """The workers the stack keeps fenced (hk3s:fences entries that do not give them up)."""
        return sorted(name for name, fence in self.fences.items() if not fence.force_remove)

    def forced_removals(self) -> list[str]:
        """The fenced workers given up (hk3s:fences.<worker>.force_remove)."""
        return sorted(name for name, fence in self.fences.items() if fence.force_remove)

    def all_workers(self) -> list[WorkerSettings]:
        """Every worker of the cluster: the entries of `workers` (with their pool's settings), then
        each pool's workers in order."""
        return [worker for worker, _, _ in self._resolved]

    def worker_config_key(self, worker: WorkerSettings) -> str:
        """The config key a worker comes from: `hk3s:workers[i]` or `hk3s:worker_pools[i]`."""
        return next(key for candidate, key, _ in self._resolved if candidate is worker)

    def pool_member(self, worker: WorkerSettings) -> PoolMember | None:
        """The pool, number, location and placement group of a pool's worker; None for the others."""
        return next((member for candidate, _, member in self._resolved if candidate is worker), None)

    def placement_groups(self) -> dict[str, list[str]]:
        """Each spread placement group the pools need, with its workers' names (at most 10)."""
        groups: dict[str, list[str]] = {}
        for worker, _, member in self._resolved:
            if member is not None and member.placement_group is not None:
                groups.setdefault(member.placement_group, []).append(worker.name)
        return groups

    def hetzner_hosts(self) -> list[HostSettings]:
        """The server and workers the program creates in Hetzner Cloud."""
        return [host for host in [self.server, *self.all_workers()] if host.kind == "hetzner"]

    def worker_firewall_managed(self, worker: WorkerSettings) -> bool:
        """Whether the program runs this worker's host firewall."""
        return self.firewall.managed if worker.firewall is None else worker.firewall


def _with_pool(worker: WorkerSettings, pool: PoolSettings) -> WorkerSettings:
    """An entry of hk3s:workers with the settings of the pool it names that it does not set."""
    fields = [*_POOL_FIELDS, *(_POOL_HETZNER_FIELDS if worker.kind == "hetzner" else ())]
    update = {field: getattr(pool, field) for field in fields if field not in worker.model_fields_set}
    update["labels"] = {**pool.labels, **worker.labels}
    if worker.kind == "hetzner" and "location" not in worker.model_fields_set and pool.locations:
        update["location"] = pool.locations[0]
    return worker.model_copy(update=update)
