"""The lab network, in this machine's root namespace and the namespaces the lab makes:

* a "public" bridge ``<id>-pub``.  The root namespace is its gateway (``.1``) and
  masquerades it to the uplink so hosts reach Debian's packages, PyPI and the Go proxy;
* a "private" bridge ``<id>-prv`` (a Hetzner-like network) with no address in the root
  namespace.  Its gateway ``.1`` lives in the lab's gateway namespace ``<id>-gw``, which
  NATs it out through the public bridge, so a host whose default route is the private NIC
  still reaches the packages;
* per host a network namespace ``<id>-h-<name>`` with ``eth0`` (public) and optionally
  ``enp7s0`` (private, MTU 1450 like Hetzner); a host "behind NAT" gets a small router
  namespace ``<id>-r-<name>`` between its ``eth0`` and the public bridge.
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from lab.hosts.addressing import SPECIAL_NETS, AddressPlan, _resolve_ipv4, machine_nameservers
from lab.hosts.host import PRIVATE_IFNAME, PRIVATE_MTU, PUBLIC_IFNAME, Host
from lab.hosts.processes import _ip, _nft, _run, _sysctl

if TYPE_CHECKING:
    from lab.hosts.lab import Lab

log = logging.getLogger("lab.hosts")

IPv4Network = ipaddress.IPv4Network
IPv4Address = ipaddress.IPv4Address


def create_core_network(lab: Lab, plan: AddressPlan) -> None:
    """The lab's bridges, its gateway namespace and the NAT and forwarding rules of both."""
    prefix = plan.public_net.prefixlen
    # Public bridge: root namespace is the gateway, masquerading to the uplink.
    _ip("link", "add", lab.public_bridge, "type", "bridge")
    _ip("addr", "add", f"{plan.public_gateway}/{prefix}", "dev", lab.public_bridge)
    _ip("link", "set", lab.public_bridge, "up")
    _ip("link", "add", lab.private_bridge, "type", "bridge")
    _ip("link", "set", lab.private_bridge, "up")
    enable_root_forwarding()
    # Lab traffic leaves only for public addresses, the resolvers and the
    # registries: never for another private or special-purpose address
    # (another lab, the machine's networks, or a host's NAT'd LAN).
    exempt = sorted(
        {IPv4Network(f"{s}/32") for s in machine_nameservers()}
        | {IPv4Network(f"{a}/24", strict=False) for addrs in _resolve_ipv4(lab.registry_hosts).values() for a in addrs},
        key=lambda n: (int(n.network_address), n.prefixlen),
    )
    exempt = [n for n in exempt if not any(n != o and n.subnet_of(o) for o in exempt)]
    leaving = f'iifname "{lab.public_bridge}" oifname != "{lab.public_bridge}"'
    exempt_rule = f"    {leaving} ip daddr {{ {', '.join(map(str, exempt))} }} accept\n" if exempt else ""
    special = ", ".join(str(n) for n in SPECIAL_NETS)
    _nft(
        f"""table ip {lab.nft_table} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {plan.public_net} ip daddr != {plan.public_net} oifname != "{lab.public_bridge}" masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname "{lab.public_bridge}" oifname "hk*" oifname != "{lab.public_bridge}" drop
{exempt_rule}    iifname "{lab.public_bridge}" oifname != "{lab.public_bridge}" ip daddr {{ {special} }} drop
  }}
}}
"""
    )
    # Gateway namespace: the private network's gateway (.1), NAT to the public bridge.
    gw = lab.gateway_netns
    _ip("netns", "add", gw)
    _ip("link", "set", "lo", "up", netns=gw)
    outer_pub = f"{lab.lab_id}-gp"
    _ip("link", "add", outer_pub, "type", "veth", "peer", "name", "pub0", "netns", gw)
    _ip("link", "set", outer_pub, "master", lab.public_bridge, "up")
    _ip("addr", "add", f"{plan.gateway_public_ip}/{prefix}", "dev", "pub0", netns=gw)
    _ip("link", "set", "pub0", "up", netns=gw)
    _ip("route", "add", "default", "via", plan.public_gateway, netns=gw)
    outer_prv = f"{lab.lab_id}-gv"
    _ip(
        "link",
        "add",
        outer_prv,
        "mtu",
        str(PRIVATE_MTU),
        "type",
        "veth",
        "peer",
        "name",
        "prv0",
        "mtu",
        str(PRIVATE_MTU),
        "netns",
        gw,
    )
    _ip("link", "set", outer_prv, "master", lab.private_bridge, "up")
    _ip("addr", "add", f"{plan.private_gateway}/{plan.private_net.prefixlen}", "dev", "prv0", netns=gw)
    _ip("link", "set", "prv0", "up", netns=gw)
    lab._gateway_networks = [plan.private_net]
    _sysctl("net.ipv4.ip_forward", "1", netns=gw)
    _nft(
        """table ip lab_gateway {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "pub0" masquerade
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
    iifname "prv0" accept
    ct state established,related accept
  }
}
""",
        netns=gw,
    )


def enable_root_forwarding() -> None:
    """The root namespace routes for the public bridge.  Left on at teardown:
    other labs, or anything else on the machine, may rely on it by then."""
    if Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() != "1":
        log.info("setting net.ipv4.ip_forward=1 (stays on after teardown)")
        _sysctl("net.ipv4.ip_forward", "1")


def add_gateway_network(lab: Lab, network: IPv4Network) -> None:
    """Give the gateway namespace an address (.1) in a host's own private network."""
    gateway = network.network_address + 1
    for existing in lab._gateway_networks:
        if gateway in existing:
            return
    _ip("addr", "add", f"{gateway}/{network.prefixlen}", "dev", "prv0", netns=lab.gateway_netns)
    lab._gateway_networks.append(network)


def netem_works(gateway_netns: str) -> bool:
    """Whether ``tc qdisc ... netem`` works on this kernel (tried in the lab's gateway namespace)."""
    probe = _run(
        ["tc", "-n", gateway_netns, "qdisc", "replace", "dev", "pub0", "root", "netem", "delay", "0ms"],
        check=False,
    )
    if probe.returncode == 0:
        _run(["tc", "-n", gateway_netns, "qdisc", "del", "dev", "pub0", "root"], check=False)
        return True
    log.info("kernel has no sch_netem: netem() uses NFQUEUE + a delay daemon")
    return False


def create_host_network(lab: Lab, host: Host, plan: AddressPlan) -> None:
    """A host's namespace and links: its public NIC on the public bridge (or behind its own NAT
    router) and its private NIC on the private bridge."""
    spec = host.spec
    ns = host.netns
    prefix = plan.public_net.prefixlen
    _ip("netns", "add", ns)
    _ip("link", "set", "lo", "up", netns=ns)
    if spec.behind_nat:
        router = host.router_netns
        assert router is not None and host.nat_inner_ip is not None
        lan_gateway = str(IPv4Address(host.nat_inner_ip) - 1)
        _ip("netns", "add", router)
        _ip("link", "set", "lo", "up", netns=router)
        outer = lab._veth(host.index, "r")
        _ip("link", "add", outer, "type", "veth", "peer", "name", "wan0", "netns", router)
        _ip("link", "set", outer, "master", lab.public_bridge, "up")
        _ip("addr", "add", f"{host.egress_ip}/{prefix}", "dev", "wan0", netns=router)
        _ip("link", "set", "wan0", "up", netns=router)
        _ip("route", "add", "default", "via", plan.public_gateway, netns=router)
        _ip("link", "add", "lan0", "type", "veth", "peer", "name", PUBLIC_IFNAME, "netns", ns, netns=router)
        _ip("addr", "add", f"{lan_gateway}/24", "dev", "lan0", netns=router)
        _ip("link", "set", "lan0", "up", netns=router)
        _sysctl("net.ipv4.ip_forward", "1", netns=router)
        inbound = (
            f"""  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "wan0" dnat to {host.nat_inner_ip}
  }}
"""
            if spec.nat_inbound
            else ""
        )
        _nft(
            f"""table ip lab_nat_router {{
{inbound}  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan0" masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    iifname "lan0" accept
    ct state established,related accept
    ct status dnat accept
  }}
}}
""",
            netns=router,
        )
        _ip("addr", "add", f"{host.nat_inner_ip}/24", "dev", PUBLIC_IFNAME, netns=ns)
        _ip("link", "set", PUBLIC_IFNAME, "up", netns=ns)
        if not spec.private_default_route:
            _ip("route", "add", "default", "via", lan_gateway, "dev", PUBLIC_IFNAME, netns=ns)
    else:
        outer = lab._veth(host.index, "p")
        _ip("link", "add", outer, "type", "veth", "peer", "name", PUBLIC_IFNAME, "netns", ns)
        _ip("link", "set", outer, "master", lab.public_bridge, "up")
        _ip("addr", "add", f"{host.public_ip}/{prefix}", "dev", PUBLIC_IFNAME, netns=ns)
        _ip("link", "set", PUBLIC_IFNAME, "up", netns=ns)
        if not spec.private_default_route:
            _ip("route", "add", "default", "via", plan.public_gateway, "dev", PUBLIC_IFNAME, netns=ns)
    if spec.private_nic:
        assert host.private_network is not None and host.private_gateway is not None
        network = IPv4Network(host.private_network)
        add_gateway_network(lab, network)
        outer = lab._veth(host.index, "v")
        mtu = str(spec.private_mtu)
        _ip(
            "link",
            "add",
            outer,
            "mtu",
            mtu,
            "type",
            "veth",
            "peer",
            "name",
            PRIVATE_IFNAME,
            "mtu",
            mtu,
            "netns",
            ns,
        )
        _ip("link", "set", outer, "master", lab.private_bridge, "up")
        _ip("addr", "add", f"{host.private_ip}/{network.prefixlen}", "dev", PRIVATE_IFNAME, netns=ns)
        _ip("link", "set", PRIVATE_IFNAME, "up", netns=ns)
        if spec.private_default_route:
            _ip("route", "add", "default", "via", host.private_gateway, "dev", PRIVATE_IFNAME, netns=ns)
