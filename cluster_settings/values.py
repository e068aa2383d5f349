"""Single values of the stack configuration: their patterns, their checks (pydantic
`AfterValidator`s that name the value and the fix) and the constrained types built on them.
The models in ``cluster_settings.models`` use them field by field."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from node_operations.k3s_release import K3S_VERSION

from .dns_names import DNS_1123_LABEL
from .kubelet_labels import kubelet_refuses_label

# The oldest k3s with everything the join uses: `k3s token create --ttl` (v1.26.2) and the
# join permit's admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (GA and on by
# default from Kubernetes 1.30; beta and off in 1.28-1.29, absent before).
MIN_K3S_VERSION = (1, 30, 0)
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# Labels the program sets itself; a stack may not set or override them.
RESERVED_LABEL_PREFIXES = ("node-role.kubernetes.io/", "kubernetes.io/", "k8s.io/", "hk3s.dev/")
# Taints the program or Kubernetes itself sets: the join's validation taint (hk3s.dev/), the
# node lifecycle controller's (node.kubernetes.io/not-ready, unreachable, out-of-service, ...)
# and the cloud provider's (node.cloudprovider.kubernetes.io/uninitialized).
RESERVED_TAINT_PREFIXES = ("hk3s.dev/", "node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# A pool's workers are named <pool>-<n>: the pool name leaves room for the number in a node name.
POOL_NAME_MAX = 56
# Hetzner refuses an eleventh server in one spread placement group.
HETZNER_SPREAD_GROUP_MAX = 10
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$"
)
SSH_PUBLIC_KEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+$")

# Hetzner Cloud locations and the network zone each belongs to: servers in one
# private network must share a zone.
NETWORK_ZONE_OF_LOCATION = {
    "fsn1": "eu-central",
    "nbg1": "eu-central",
    "hel1": "eu-central",
    "ash": "us-east",
    "hil": "us-west",
    "sin": "ap-southeast",
}


def _node_name(value: str) -> str:
    if len(value) > 63 or not DNS_1123_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 node name; use at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit (e.g. 'worker-1')"
        )
    return value


def _k3s_version(value: str) -> str:
    match = K3S_VERSION.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a k3s release; write it as k3s tags it, e.g. 'v1.36.1+k3s1'")
    if tuple(int(part) for part in match.groups()[:3]) < MIN_K3S_VERSION:
        raise ValueError(
            f"{value} is older than v1.30.0, the first k3s whose Kubernetes serves the "
            "ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) that keeps each join token "
            "to its node; choose v1.30.0+k3s1 or later (a supported release, e.g. v1.36.1+k3s1)"
        )
    return value


def _location(value: str) -> str:
    if value not in NETWORK_ZONE_OF_LOCATION:
        raise ValueError(
            f"{value!r} is not a Hetzner Cloud location; use one of " + ", ".join(sorted(NETWORK_ZONE_OF_LOCATION))
        )
    return value


def _ssh_address(value: str) -> str:
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not HOSTNAME.match(value):
        raise ValueError(f"{value!r} is neither an IP address nor a host name")
    return value


def _ipv4_network(value: str) -> str:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as error:
        raise ValueError(
            f"{value!r} is not a network in CIDR form with its host bits zero ({error}); write it like '10.0.0.0/16'"
        ) from None
    if net.version != 4:
        raise ValueError(f"{value!r} is IPv6; the cluster's node networks are IPv4")
    return str(net)


def _ipv4_address(value: str) -> str:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 address; give the host's address, e.g. '198.51.100.7'") from None
    if address.version != 4:
        raise ValueError(f"{value!r} is IPv6; every node needs an IPv4 address")
    return str(address)


def _pool_name(value: str) -> str:
    _node_name(value)
    if len(value) > POOL_NAME_MAX:
        raise ValueError(
            f"{value!r} is longer than {POOL_NAME_MAX} characters; its workers are named <pool>-<n>, "
            "which must stay a node name of at most 63"
        )
    return value


def _taint(value: str) -> str:
    """`key=value:Effect` or `key:Effect`, by Kubernetes' rules for taint keys, values and effects."""
    head, sep, effect = value.rpartition(":")
    if not sep or effect not in TAINT_EFFECTS:
        raise ValueError(
            f"taint {value!r} needs an effect: write key=value:Effect or key:Effect with Effect one of "
            + ", ".join(TAINT_EFFECTS)
        )
    key, _, taint_value = head.partition("=")
    _check_key_and_value(
        key,
        taint_value,
        RESERVED_TAINT_PREFIXES,
        invalid_key=f"taint key {key!r} of {value!r} is not a valid Kubernetes key",
        reserved_key=f"taint {value!r} uses a key the program or Kubernetes sets",
        invalid_value=f"taint value {taint_value!r} of {value!r} is not a valid Kubernetes label value",
    )
    return value


def _check_key_and_value(
    key: str, value: str, reserved: tuple[str, ...], *, invalid_key: str, reserved_key: str, invalid_value: str
) -> None:
    """Kubernetes' rules for a label's or a taint's key and value, and the key prefixes the
    program or Kubernetes itself sets; each failure raised with its message."""
    if not LABEL_KEY.match(key) or len(key.rpartition("/")[2]) > 63:
        raise ValueError(invalid_key)
    if key.startswith(reserved):
        raise ValueError(f"{reserved_key}; choose a key outside " + ", ".join(reserved))
    if not LABEL_VALUE.match(value):
        raise ValueError(invalid_value)


def _unique_taints(taints: list[str]) -> list[str]:
    # Kubernetes refuses a node with two taints of one key and effect.
    seen: set[tuple[str, str]] = set()
    for taint in taints:
        head, _, effect = taint.rpartition(":")
        pair = (head.partition("=")[0], effect)
        if pair in seen:
            raise ValueError(f"two taints with key {pair[0]!r} and effect {effect}; keep one")
        seen.add(pair)
    return taints


def _labels(value: dict[str, str]) -> dict[str, str]:
    for key, label in value.items():
        _check_key_and_value(
            key,
            label,
            RESERVED_LABEL_PREFIXES,
            invalid_key=f"label key {key!r} is not a valid Kubernetes label key",
            reserved_key=f"label {key!r} is set by the program or Kubernetes",
            invalid_value=f"label value {label!r} of {key!r} is not a valid Kubernetes label value",
        )
        if kubelet_refuses_label(key):
            # k3s passes every label to the kubelet's --node-labels at each start.
            raise ValueError(
                f"label {key!r} is in the kubernetes.io/k8s.io namespace, where the kubelet takes "
                "only its own labels and refuses to start with any other (k3s's agent would "
                f"restart in a loop); use a domain of your own (e.g. 'example.com/{key.rpartition('/')[2]}') "
                "or a key under node.kubernetes.io/"
            )
    return value


def _hetzner_server_in(value: object) -> object:
    # YAML gives an id as a number; it is kept as text, as a name is.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _hetzner_server(value: str) -> str:
    if value.isdigit() and int(value) > 0:
        return value
    if not value.isdigit() and HOSTNAME.match(value) and len(value) <= 63:
        return value
    raise ValueError(
        f"{value!r} names no Hetzner server; give the server's id (e.g. 4711) or its name as Hetzner's "
        "console shows it (a host name, e.g. 'worker-1')"
    )


NodeName = Annotated[str, AfterValidator(_node_name)]
HetznerServer = Annotated[str, BeforeValidator(_hetzner_server_in), AfterValidator(_hetzner_server)]
PoolName = Annotated[str, AfterValidator(_pool_name)]
Taint = Annotated[str, AfterValidator(_taint)]
Taints = Annotated[list[Taint], AfterValidator(_unique_taints)]
Labels = Annotated[dict[str, str], AfterValidator(_labels)]
K3sVersion = Annotated[str, AfterValidator(_k3s_version)]
Location = Annotated[str, AfterValidator(_location)]
SshAddress = Annotated[str, AfterValidator(_ssh_address)]
IPv4Cidr = Annotated[str, AfterValidator(_ipv4_network)]
IPv4Addr = Annotated[str, AfterValidator(_ipv4_address)]
Port = Annotated[int, Field(ge=1, le=65535)]
