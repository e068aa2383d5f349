"""What the Hetzner project must offer and hold before the stack makes its machines.

Read at every preview and `up` from Hetzner's API with Hetzner's library (GET calls only),
before any resource is registered, so a setting Hetzner would refuse fails the
run naming the setting, and nothing changes:

- every machine the run will create has a server type that exists and is offered
  in its location (types are offered per location, CX and CAX only in the EU;
  deprecated ones go away), and an image that exists for the type's architecture. A
  deprecated image is used with a warning until its `unavailable_after` date (Hetzner still
  creates servers from it until then) and refused after it.
  A server the stack already made (the project lists it under the stack's name and
  labels) is not refused: type, location and image are creation-only (ignored
  after creation), so Hetzner withdrawing them later changes nothing about it, and
  a refusal would block every run of a running stack (a fence, a removal, an
  upgrade). One warning line names such servers;
- the names the stack gives its Hetzner resources are free: names are unique per
  project, and they are derived from the cluster and the stack, so two stacks in
  one project (dev and staging) never collide; a name another owner already
  holds is refused;
- the control plane is the one this stack made: the project lists this stack's control-plane
  server (its `hk3s-role: server` label, and its owner label, or for a server made before that
  label its cluster and stack labels) under the node name it was made for (`hk3s-node`, or its
  name). A new hk3s:server.name (or a server that is now an existing host) would give the
  control plane a new Pulumi resource: Pulumi creates the new server first and only then refuses
  to delete the protected one, and a k3s node cannot be renamed anyway; so it is refused here,
  naming the name to set back. Renaming hk3s:cluster.name is no replacement: it renames the
  servers, the network, the firewalls and the key in place (terraform-provider-hcloud updates
  `name` and `labels` of each in place).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pulumi

from cluster_settings.loading import SettingsError
from cluster_settings.models import HostSettings, StackSettings
from cluster_settings.rules import SettingProblem, host_setting_key
from components.hetzner_ssh_key import OWNER_LABEL, stack_owner
from remote_access.hetzner_api import DEFAULT_ENDPOINT, HetznerAccess

HETZNER_NAME_MAX = 63
STACK_LABEL = "hk3s-stack"
CLUSTER_LABEL = "hk3s-cluster"
ROLE_LABEL = "hk3s-role"
# The node a Hetzner server was made for: its name in the stack's settings (a DNS-1123 label,
# so always a valid label value).
NODE_LABEL = "hk3s-node"


def hetzner_name(cluster: str, stack: str, *parts: str) -> str:
    """A Hetzner resource name unique to this cluster and stack: `<cluster>-<stack>-<parts>`,
    a valid hostname label (servers take their name as hostname), at most 63 characters
    (longer names keep a hash of the whole so they stay distinct)."""
    text = "-".join([cluster, stack, *parts]).lower()
    text = re.sub(r"[^a-z0-9-]+", "-", text).strip("-")
    if len(text) <= HETZNER_NAME_MAX:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[: HETZNER_NAME_MAX - 9].rstrip('-')}-{digest}"


def ownership_labels(cluster: str, stack: str) -> dict[str, str]:
    """Labels on every Hetzner resource the stack makes: whose it is."""
    return {CLUSTER_LABEL: cluster, STACK_LABEL: stack}


def server_labels(cluster: str, stack: str, owner: str, node: str, role: str) -> dict[str, str]:
    """A server's labels: whose it is (cluster, stack and the owner, `<project>.<stack>`, which
    survives a rename of the cluster), the node it was made for and its role."""
    return {**ownership_labels(cluster, stack), OWNER_LABEL: owner, NODE_LABEL: node, ROLE_LABEL: role}


def _this_stacks_server(labels: Mapping[str, str] | None, cluster: str, stack: str, owner: str) -> bool:
    """By the owner label; a server made before it by its cluster and stack labels."""
    labels = labels or {}
    if OWNER_LABEL in labels:
        return labels[OWNER_LABEL] == owner
    return _ours(labels, cluster, stack)


@dataclass(frozen=True)
class PlannedName:
    """A name the stack will give a Hetzner resource, and the setting behind it."""

    kind: str  # "server", "network", "firewall", "placement group"
    name: str
    setting: str


def _field(item: Any, name: str) -> Any:
    """A field of a data source's result: the SDK hands some lists over as objects, others as dicts."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _ours(labels: Mapping[str, str] | None, cluster: str, stack: str) -> bool:
    labels = labels or {}
    return labels.get(CLUSTER_LABEL) == cluster and labels.get(STACK_LABEL) == stack


def _offered(location_entry: Any, now: datetime) -> bool:
    """A server type's entry for one location says it can be ordered there now."""
    if not _field(location_entry, "available"):
        return False
    unavailable_after = _field(location_entry, "unavailable_after") or ""
    if _field(location_entry, "is_deprecated") and unavailable_after:
        try:
            return datetime.fromisoformat(unavailable_after.replace("Z", "+00:00")) > now
        except ValueError:
            return False
    return True


def _moment(value: Any) -> datetime | None:
    """An RFC 3339 time from Hetzner's API ("" or unreadable: None)."""
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def _image_deprecation(image: Any, now: datetime) -> tuple[bool, datetime | None]:
    """(whether Hetzner has deprecated the image, the date it stops creating servers from it).
    Hetzner creates servers from a deprecated image until its `unavailable_after`; after that
    date it refuses them (Hetzner's API reference, an image's `deprecation`; hcloud-go's
    deprecationutil.ImageMessage: "deprecated and will no longer be available for order as of
    <date>", then "unavailable and can no longer be ordered")."""
    deprecated = bool(_field(image, "is_deprecated") or _field(image, "deprecated"))
    return deprecated, _moment(_field(image, "unavailable_after")) if deprecated else None


def _type_problems(
    settings: StackSettings,
    hosts: Sequence[HostSettings],
    server_types: Sequence[Any],
    images: Sequence[Any],
    deprecations: dict[tuple[str, str, str], list[str]] | None = None,
) -> list[SettingProblem]:
    """What Hetzner would refuse about creating `hosts` now. A deprecated image it still creates
    servers from is no problem: `deprecations` collects its hosts, keyed by (setting, image,
    the date it goes), for one warning."""
    now = datetime.now(UTC)
    by_name = {_field(server_type, "name"): server_type for server_type in server_types}

    def offered_in(location: str) -> list[str]:
        return sorted(
            _field(server_type, "name")
            for server_type in server_types
            if any(
                _field(entry, "name") == location and _offered(entry, now)
                for entry in _field(server_type, "locations") or []
            )
        )

    problems: list[SettingProblem] = []
    seen: set[tuple[str, str, str, str, str]] = set()
    for host in hosts:
        type_name = host.server_type or settings.cluster.server_type
        location = host.location or settings.cluster.location
        image = host.image or settings.cluster.image
        type_key = host_setting_key(settings, host, "server_type") if host.server_type else "hk3s:cluster.server_type"
        image_key = host_setting_key(settings, host, "image") if host.image else "hk3s:cluster.image"
        # Hosts that share the type, location and image settings share their answer.
        if (type_key, type_name, location, image_key, image) in seen:
            if deprecations is not None:
                for (key, name, _), sharing in deprecations.items():
                    if key == image_key and name == image:
                        sharing.append(host.name)
            continue
        seen.add((type_key, type_name, location, image_key, image))
        offers = ", ".join(offered_in(location)) or "none"
        server_type = by_name.get(type_name)
        if server_type is None:
            problems.append(
                SettingProblem(
                    type_key,
                    f"Hetzner has no server type {type_name!r} (for {host.name}); {location} offers: {offers}",
                )
            )
            continue
        entry = next(
            (entry for entry in _field(server_type, "locations") or [] if _field(entry, "name") == location), None
        )
        if entry is None or not _offered(entry, now):
            why = "is not offered" if entry is None else "cannot be ordered now"
            problems.append(
                SettingProblem(
                    type_key,
                    f"server type {type_name!r} {why} in {location} (for {host.name}); {location} offers: {offers}",
                )
            )
            continue
        architecture = _field(server_type, "architecture")
        fitting = [image for image in images if _field(image, "architecture") == architecture]
        # The names to offer instead: the images Hetzner has not deprecated.
        current = sorted(
            {str(_field(i, "name")) for i in fitting if _field(i, "name") and not _image_deprecation(i, now)[0]}
        )
        found = next((i for i in fitting if image in (_field(i, "name"), str(_field(i, "id")))), None)
        if found is None:
            problems.append(
                SettingProblem(
                    image_key,
                    f"Hetzner has no {architecture} image {image!r} for {host.name}'s server type "
                    f"{type_name}; it has: {', '.join(current[:12]) or 'none'}",
                )
            )
            continue
        deprecated, unavailable_after = _image_deprecation(found, now)
        if not deprecated:
            continue
        if unavailable_after is not None and unavailable_after <= now:
            problems.append(
                SettingProblem(
                    image_key,
                    f"image {image!r} (for {host.name}) is deprecated and Hetzner creates no server from it since "
                    f"{unavailable_after.date().isoformat()}; choose another {architecture} image: "
                    f"{', '.join(current[:12]) or 'none'}",
                )
            )
        elif deprecations is not None:
            until = unavailable_after.date().isoformat() if unavailable_after else "a date Hetzner has not given"
            deprecations.setdefault((image_key, image, until), []).append(host.name)
    return problems


def _name_problems(
    cluster: str, stack: str, planned: Sequence[PlannedName], held: Mapping[str, Sequence[Any]]
) -> list[SettingProblem]:
    problems: list[SettingProblem] = []
    for item in planned:
        for existing in held.get(item.kind, []):
            if _field(existing, "name") == item.name and not _ours(_field(existing, "labels"), cluster, stack):
                problems.append(
                    SettingProblem(
                        item.setting,
                        f"the Hetzner project already has a {item.kind} named {item.name!r} that this stack did not "
                        "make; rename or delete it in the Hetzner project, or give this cluster another "
                        "hk3s:cluster.name",
                    )
                )
    return problems


def planned_names(settings: StackSettings, stack: str, private_network: bool) -> list[PlannedName]:
    """Every Hetzner name this stack's resources will carry, with the setting that shapes it."""
    cluster = settings.cluster.name
    planned = [
        PlannedName("server", hetzner_name(cluster, stack, host.name), host_setting_key(settings, host, "name"))
        for host in settings.hetzner_hosts()
    ]
    if private_network:
        planned.append(PlannedName("network", hetzner_name(cluster, stack, "network"), "hk3s:cluster.name"))
    for group, members in settings.placement_groups().items():
        worker = next(w for w in settings.all_workers() if w.name == members[0])
        planned.append(
            PlannedName("placement group", hetzner_name(cluster, stack, group), settings.worker_config_key(worker))
        )
    if settings.hetzner_hosts() and settings.firewall.cloud_firewall:
        planned += [
            PlannedName("firewall", hetzner_name(cluster, stack, part), "hk3s:cluster.name")
            for part in ("ssh-only", "servers", "workers")
        ]
    return planned


def control_plane_problems(
    settings: StackSettings, stack: str, owner: str, held_servers: Sequence[Any]
) -> list[SettingProblem]:
    """This stack's control-plane server in the project, when the settings now name another one."""
    wanted = settings.server.name if settings.server.kind == "hetzner" else None
    problems: list[SettingProblem] = []
    for server in held_servers:
        labels = _field(server, "labels") or {}
        if labels.get(ROLE_LABEL) != "server":
            continue
        if not _this_stacks_server(labels, settings.cluster.name, stack, owner):
            continue
        name = _field(server, "name")
        node = labels.get(NODE_LABEL)
        if node is None:
            # Made before the node label (so this cluster's by its labels): named <cluster>-<stack>-<node>.
            prefix = hetzner_name(settings.cluster.name, stack) + "-"
            same = wanted is not None and name == hetzner_name(settings.cluster.name, stack, wanted)
            node = name[len(prefix) :] if name.startswith(prefix) else None
        else:
            same = node == wanted
        if same:
            continue
        was = f"node {node!r}" if node else "its node"
        now = f"hk3s:server.name {wanted!r}" if wanted else "an existing host as hk3s:server"
        problems.append(
            SettingProblem(
                "hk3s:server.name",
                f"this stack's control plane is the Hetzner server {name!r} ({was}); {now} would create a "
                "second control-plane server before the protected one's delete is refused, and a k3s node "
                "cannot be renamed"
                + (f"; set hk3s:server.name back to {node!r}" if node else "; set hk3s:server back to it"),
            )
        )
    return problems


HetznerReads = Callable[[], tuple[Sequence[Any], Sequence[Any], Mapping[str, Sequence[Any]]]]


def _deprecation(item: Any) -> dict[str, Any]:
    """`is_deprecated` and `unavailable_after` (RFC 3339, "" when none) of an API object that
    carries Hetzner's `deprecation` {announced, unavailable_after} (an image's older `deprecated`
    timestamp is being removed from the API in its favour: Hetzner's changelog of 2026-09-08)."""
    deprecation = getattr(item, "deprecation", None)
    after = getattr(deprecation, "unavailable_after", None)
    return {
        "is_deprecated": deprecation is not None,
        "unavailable_after": after.isoformat() if isinstance(after, datetime) else str(after or ""),
    }


def read_hetzner_project(
    access: HetznerAccess | None = None,
) -> tuple[Sequence[Any], Sequence[Any], Mapping[str, Sequence[Any]]]:
    """Server types, images, and the servers, networks, firewalls and placement groups the project
    holds, read from Hetzner's API itself with Hetzner's library (GET calls only, so a preview
    changes nothing). Read there and not through the Pulumi provider's data sources: what is judged
    is what the API says (a type's per-location `available`, an image's `deprecation`) whatever
    version of the provider plugin a user has (an older one leaves those fields out).
    `access`: the token and endpoint (default: where the Hetzner provider reads them)."""
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use, as remote_access does
    from requests import RequestException  # noqa: PLC0415 - loaded on first use

    access = access or hetzner_access()
    client = access.client()
    try:
        server_types = [
            {
                "name": server_type.name,
                "architecture": server_type.architecture,
                "locations": [
                    {
                        "name": entry.location.name if entry.location is not None else None,
                        "available": entry.available,
                        **_deprecation(entry),
                    }
                    for entry in server_type.locations or []
                ],
            }
            for server_type in client.server_types.get_all()
        ]
        # Deprecated images too: Hetzner still creates servers from them until `unavailable_after`.
        images = [
            {"name": image.name, "id": image.id, "architecture": image.architecture, **_deprecation(image)}
            for image in client.images.get_all(include_deprecated=True)
        ]
        held: dict[str, Sequence[Any]] = {
            kind: [{"name": item.name, "labels": dict(item.labels or {})} for item in listing.get_all()]
            for kind, listing in (
                ("server", client.servers),
                ("network", client.networks),
                ("firewall", client.firewalls),
                ("placement group", client.placement_groups),
            )
        }
    except APIException as error:
        raise SettingsError([SettingProblem(*_read_failed(access, error))]) from None
    except RequestException as error:
        # requests names the URL, never the header holding the token.
        raise SettingsError(
            [
                SettingProblem(
                    "hcloud:endpoint",
                    f"the Hetzner API at {access.endpoint} did not answer ({type(error).__name__}); check "
                    "hcloud:endpoint (unset: Hetzner's own) and this machine's network, then run again",
                )
            ]
        ) from None
    return server_types, images, held


def _read_failed(access: HetznerAccess, error: Any) -> tuple[str, str]:
    """The setting to blame and the line saying so, for Hetzner refusing the project's reads."""
    answer = f"Hetzner's API at {access.endpoint} answered {error.code}: {error.message}"
    if error.code in ("unauthorized", 401):
        return "hcloud:token", (
            f"{answer}; the token is wrong or revoked: pulumi config set --secret hcloud:token <a token of the "
            "Hetzner project> (or HCLOUD_TOKEN), and check hcloud:endpoint"
        )
    if error.code in ("forbidden", 403):
        return "hcloud:token", f"{answer}; give a token of the Hetzner project that may read it (hcloud:token)"
    return "hcloud:endpoint", f"{answer}; reading the project's catalogue failed: check hcloud:endpoint, then run again"


def existing_servers(
    settings: StackSettings, stack: str, held_servers: Sequence[Any], owner: str | None = None
) -> tuple[list[HostSettings], list[HostSettings]]:
    """The stack's Hetzner hosts split into (to be created, already made). A host is made when the
    project holds a server with its name that carries this stack's labels, or one with this
    stack's owner label made for its node (a renamed cluster's): the listing is read at every
    run, so it also knows a server a crashed run created before Pulumi recorded it."""
    ours = {
        _field(server, "name")
        for server in held_servers
        if _ours(_field(server, "labels"), settings.cluster.name, stack)
    }
    owned_nodes = {
        (_field(server, "labels") or {}).get(NODE_LABEL)
        for server in held_servers
        if owner is not None and (_field(server, "labels") or {}).get(OWNER_LABEL) == owner
    }
    to_create: list[HostSettings] = []
    made: list[HostSettings] = []
    for host in settings.hetzner_hosts():
        held = hetzner_name(settings.cluster.name, stack, host.name) in ours or host.name in owned_nodes
        (made if held else to_create).append(host)
    return to_create, made


def check_hetzner_project(
    settings: StackSettings,
    stack: str,
    planned: Sequence[PlannedName],
    read: HetznerReads | None = None,
    owner: str | None = None,
) -> None:
    """Refuse, before anything is registered, what Hetzner would refuse halfway through a run,
    and a control plane named other than the one this stack made. Only servers the run will
    create are held to what Hetzner offers now; servers that exist get at most one warning line.
    `read` reads the project (default: `read_hetzner_project`, through Hetzner's API); `owner` is
    this stack's owner label value (default: `stack_owner()`)."""
    hosts = settings.hetzner_hosts()
    if not hosts and not planned:
        return
    owner = owner or stack_owner()
    server_types, images, held = read() if read is not None else read_hetzner_project()
    to_create, made = existing_servers(settings, stack, held.get("server", []), owner)
    problems = control_plane_problems(settings, stack, owner, held.get("server", []))
    deprecations: dict[tuple[str, str, str], list[str]] = {}
    problems += _type_problems(settings, to_create, server_types, images, deprecations) if to_create else []
    problems += _name_problems(settings.cluster.name, stack, planned, held)
    if problems:
        raise SettingsError(problems)
    for (key, image, until), names in deprecations.items():
        pulumi.log.warn(
            f"{key}: image {image!r} is deprecated; Hetzner still creates servers from it until {until}, so "
            f"{', '.join(names)} will be created from it, but after that date a new server from it is refused: "
            "set a current image before then"
        )
    outdated = [host for host in made if _type_problems(settings, [host], server_types, images)]
    if outdated:
        reasons = "; ".join(str(p) for p in _type_problems(settings, outdated, server_types, images))
        pulumi.log.warn(
            f"{', '.join(host.name for host in outdated)} exist and are kept as they are, but Hetzner would "
            f"not create them now ({reasons}): change the setting before such a server is replaced or added"
        )


def _token_and_endpoint() -> tuple[str | None, str | None]:
    """Where the Hetzner Pulumi provider reads them: hcloud:token and hcloud:endpoint, else
    HCLOUD_TOKEN and HCLOUD_ENDPOINT in the environment."""
    config = pulumi.Config("hcloud")
    token = config.get("token") or os.environ.get("HCLOUD_TOKEN") or None
    return token, config.get("endpoint") or os.environ.get("HCLOUD_ENDPOINT") or None


def hetzner_access() -> HetznerAccess:
    """The token and endpoint of the program's own reads of the Hetzner API (the token stays out
    of every message: HetznerAccess keeps it out of its repr, Hetzner's library puts it only in
    the Authorization header)."""
    token, endpoint = _token_and_endpoint()
    if not token:
        raise SettingsError(
            [
                SettingProblem(
                    "hcloud:token",
                    "the Hetzner project is read before anything is made, and there is no token: pulumi config "
                    "set --secret hcloud:token <token> (or set HCLOUD_TOKEN)",
                )
            ]
        )
    return HetznerAccess(token, endpoint or DEFAULT_ENDPOINT)


def hetzner_api_token() -> tuple[pulumi.Output[str] | None, str | None]:
    """The Hetzner API's token (a secret) and endpoint for the program's own calls, read where the
    Hetzner Pulumi provider reads them: hcloud:token and hcloud:endpoint, else HCLOUD_TOKEN and
    HCLOUD_ENDPOINT in the environment; (None, ...) when there is no token."""
    token, endpoint = _token_and_endpoint()
    return (pulumi.Output.secret(token) if token else None), endpoint
