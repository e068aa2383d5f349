"""Real Debian hosts for tests: systemd-nspawn containers on lab bridges, reached by real SSH.

A :class:`Lab` owns, on this machine:

* a Debian bookworm base tree, built once by debootstrap into
  ``cache_dir/base-<hash of the package list>`` and shared read-only;
* a "public" bridge ``<id>-pub`` in the root network namespace.  The root
  namespace is its gateway (``.1``) and masquerades it to the uplink so hosts
  reach Debian's packages, PyPI and the Go proxy;
* a "private" bridge ``<id>-prv`` (a Hetzner-like network, ``10.0.0.0/16`` by
  default) with no address in the root namespace.  Its gateway ``.1`` lives in
  the lab's gateway namespace ``<id>-gw``, which NATs it out through the
  public bridge, so a host whose default route is the private NIC still
  reaches the packages;
* per host: a network namespace ``<id>-h-<name>`` with ``eth0`` (public) and
  optionally ``enp7s0`` (private, MTU 1450 like Hetzner), an overlay mount of
  the base tree, per-host SSH host keys, machine-id and hostname, and a
  detached supervisor process running ``systemd-nspawn --boot``;
* a host "behind NAT" gets a small router namespace ``<id>-r-<name>`` between
  its ``eth0`` and the public bridge: it can connect out, nothing on the
  public bridge can connect in.  The lab reaches it over SSH from inside that
  router namespace (its LAN).

Address ranges are picked when the lab's network is set up, so they clash with
no route or address of this machine, no resolver, and no address the
machine's resolver gives for the package registries (see
:func:`reserved_networks`).  The picks are logged (logger ``lab.hosts``) and
kept on :attr:`Lab.plan`.

Every name the lab creates starts with its id (``hk`` + 4 hex digits), so
labs never collide; :meth:`Lab.teardown` removes them all, and
:meth:`Lab.leftovers` lists whatever is still there.

On the machine itself the lab turns on ``net.ipv4.ip_forward`` (and leaves
it on) and needs the Debian packages in :data:`lab.hosts.lab.MACHINE_PACKAGES` (install
them with ``--no-install-recommends``).

Command line: ``python -m lab.hosts up --hosts 3 [--variety]`` / ``python -m
lab.hosts list`` / ``python -m lab.hosts down [--lab ID | --all]``.

The parts, one module each:

* :mod:`lab.hosts.processes`: commands, processes and mounts on this machine;
* :mod:`lab.hosts.addressing`: the address ranges and how they are picked;
* :mod:`lab.hosts.host`: :class:`HostSpec` and :class:`Host` (commands, links, netem, power, keys);
* :mod:`lab.hosts.base_tree`: the Debian base tree every host overlays;
* :mod:`lab.hosts.network`: the bridges, namespaces, veths and NAT of the lab network;
* :mod:`lab.hosts.lab`: :class:`Lab` (hosts, their boot, state, teardown) and stale-lab reaping;
* :mod:`lab.hosts.cli`: the command line.

What other code uses is importable from ``lab.hosts`` itself.
"""

from lab.hosts.addressing import AddressPlan, reserved_networks
from lab.hosts.errors import HostNotRunningError, LabError
from lab.hosts.host import Host, HostSpec
from lab.hosts.lab import (
    DEFAULT_CACHE_DIR,
    DEFAULT_RUN_ROOT,
    Lab,
    Leftovers,
    all_lab_dirs,
    missing_prerequisites,
    reap_stale_labs,
)

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_RUN_ROOT",
    "AddressPlan",
    "Host",
    "HostNotRunningError",
    "HostSpec",
    "Lab",
    "LabError",
    "Leftovers",
    "all_lab_dirs",
    "missing_prerequisites",
    "reap_stale_labs",
    "reserved_networks",
]
