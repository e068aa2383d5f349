"""Which docs page (and section) explains a refusal, so its message can end with it.

A person who meets a refusal reads its message first; the rules behind it are on one page of
docs/. The link is chosen here, in one place, rather than written into each message: by the
refusal's code, or for a refused setting by the longest prefix of its key. Every target is a
docs page and a heading anchor as GitHub makes it (lower case, punctuation dropped, spaces as
'-'); tests/node_operations/test_doc_links.py checks each one exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # refusal.py imports this module to link each refusal
    from .refusal import RefusalCode

REFUSAL_PAGES: dict[RefusalCode, str] = {
    "capability-missing": "docs/capabilities.md#what-this-release-does",
    "preflight": "docs/joining.md#how-a-worker-joins",
    "settings": "docs/configuration.md#configuration-reference",
    "host-key": "docs/security.md#host-keys-known-before-the-first-login",
    "teardown": "docs/teardown.md#tearing-down",
    "removal": "docs/reboots-removal-upgrades.md#removing-a-worker",
    "fence": "docs/fencing.md#fencing-a-worker-that-is-down",
}

# Settings whose rules a task page explains; any other key links to its table in the reference.
SETTING_PAGES: dict[str, str] = {
    "hk3s:network": "docs/network-and-firewalls.md#how-the-nodes-talk-to-each-other-hk3snetwork",
    "hk3s:firewall": "docs/network-and-firewalls.md#which-ports-are-open-the-whole-list",
    "hk3s:cluster.pod_network": "docs/network-and-firewalls.md#how-the-nodes-talk-to-each-other-hk3snetwork",
    "hk3s:cluster.vxlan_over_public_addresses": (
        "docs/network-and-firewalls.md#how-the-nodes-talk-to-each-other-hk3snetwork"
    ),
    "hk3s:cluster.pod_cidr": "docs/network-and-firewalls.md#how-the-nodes-talk-to-each-other-hk3snetwork",
    "hk3s:cluster.service_cidr": "docs/network-and-firewalls.md#how-the-nodes-talk-to-each-other-hk3snetwork",
    "hk3s:cluster.k3s_version": "docs/reboots-removal-upgrades.md#upgrading-k3s",
    "hk3s:cluster.teardown": "docs/teardown.md#tearing-down",
    "hk3s:cluster.protect_control_plane": "docs/changing-things.md#changing-things-later",
    "hk3s:storage": "docs/copies-and-disk-probe.md#which-workers-hold-copies-of-data-the-disk-probe",
    "hk3s:storage.longhorn_version": "docs/copies-and-disk-probe.md#longhorns-settings-kept",
    "hk3s:storage.longhorn_chart": "docs/copies-and-disk-probe.md#longhorns-settings-kept",
    "hk3s:ssh.host_keys": "docs/security.md#host-keys-known-before-the-first-login",
    "hk3s:ssh.trust_on_first_use": "docs/security.md#host-keys-known-before-the-first-login",
    "hk3s:ssh.private_key_file": "docs/changing-things.md#rotating-the-login-key",
    "hk3s:ssh.previous_private_key_file": "docs/changing-things.md#rotating-the-login-key",
    "hk3s:ssh.hetzner_key": "docs/getting-started-hetzner.md#the-operators-key-in-hetzner",
    "hk3s:worker_pools": "docs/pools.md#worker-pools",
    "hk3s:fences": "docs/fencing.md#fencing-a-worker-that-is-down",
}

# The reference's table per top-level key (its headings, e.g. "`hk3s:workers[]`", anchor so).
REFERENCE_SECTIONS = ("cluster", "server", "ssh", "network", "firewall", "storage", "workers", "worker_pools")


def setting_link(key: str) -> str:
    """The page that explains setting `key` (e.g. ``hk3s:workers[2].address``): the longest
    prefix in SETTING_PAGES, else the key's table in the configuration reference."""
    matches = [prefix for prefix in SETTING_PAGES if key == prefix or key.startswith((prefix + ".", prefix + "["))]
    if matches:
        return SETTING_PAGES[max(matches, key=len)]
    top = key.removeprefix("hk3s:").split(".", 1)[0].split("[", 1)[0]
    if top in REFERENCE_SECTIONS:
        return f"docs/configuration.md#hk3s{top}"
    return REFUSAL_PAGES["settings"]


def settings_links(keys: Iterable[str]) -> str:
    """The pages for several settings, each once, in the order the keys come."""
    return ", ".join(dict.fromkeys(setting_link(key) for key in keys))


def with_docs_link(message: str, link: str) -> str:
    """`message` ending with "See <link>." (on a line of its own after a message of several
    lines). A message that names a docs page already is left as it is."""
    text = message.rstrip()
    if not link or "See docs/" in text:
        return text
    return f"{text}{chr(10) if chr(10) in text else ' '}See {link}."
