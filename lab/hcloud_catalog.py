"""What the Hetzner API stand-in (lab/hcloud_standin.py) offers: its server types, locations,
datacenters and system images, each shaped as Hetzner's API reference (docs.hetzner.cloud:
"Server Types", "Locations", "Data Centers", "Images") describes the object. LAB ONLY.

The names are Hetzner's (cx23, cx33, fsn1, nbg1, hel1, debian-12, ...); the ids, prices and
sizes are the stand-in's own (nobody reads them as facts). `cx22` is deprecated, as Hetzner
deprecated the cx22 generation for cx23: its `deprecation` is set and `deprecated` true, and
servers of it are still created (Hetzner refuses a type only once it is unavailable in the
location: `invalid_server_type`). An image is deprecated by `HcloudStandin.deprecate_image`.
"""

from __future__ import annotations

from typing import Any

# (id, name, city, country, network zone)
LOCATIONS: tuple[tuple[int, str, str, str, str], ...] = (
    (1, "fsn1", "Falkenstein", "DE", "eu-central"),
    (2, "nbg1", "Nuremberg", "DE", "eu-central"),
    (3, "hel1", "Helsinki", "FI", "eu-central"),
)
# (id, name, location name)
DATACENTERS: tuple[tuple[int, str, str], ...] = (
    (4, "fsn1-dc14", "fsn1"),
    (2, "nbg1-dc3", "nbg1"),
    (3, "hel1-dc2", "hel1"),
)
# (id, name, cores, memory GB, disk GB, deprecated since)
SERVER_TYPES: tuple[tuple[int, str, int, float, int, str | None], ...] = (
    (22, "cx22", 2, 4.0, 40, "2025-10-16T06:00:00+00:00"),
    (104, "cx23", 2, 4.0, 40, None),
    (105, "cx33", 4, 8.0, 80, None),
    (106, "cx43", 8, 16.0, 160, None),
    (107, "cx53", 16, 32.0, 320, None),
)
# (id, name, os flavor, os version, description)
IMAGES: tuple[tuple[int, str, str, str, str], ...] = (
    (114690387, "debian-12", "debian", "12", "Debian 12"),
    (202151413, "debian-13", "debian", "13", "Debian 13"),
    (103908130, "ubuntu-22.04", "ubuntu", "22.04", "Ubuntu 22.04"),
    (161547269, "ubuntu-24.04", "ubuntu", "24.04", "Ubuntu 24.04"),
)
CREATED = "2018-01-01T00:00:00+00:00"


def location_view(name: str) -> dict[str, Any]:
    id_, name, city, country, zone = next(item for item in LOCATIONS if item[1] == name)
    return {
        "id": id_,
        "name": name,
        "description": f"{city} DC Park 1",
        "country": country,
        "city": city,
        "latitude": 50.0,
        "longitude": 12.0,
        "network_zone": zone,
    }


def server_type_view(name: str) -> dict[str, Any]:
    id_, name, cores, memory, disk, deprecated = next(item for item in SERVER_TYPES if item[1] == name)
    deprecation = (
        {"announced": deprecated, "unavailable_after": "2026-12-31T00:00:00+00:00"} if deprecated is not None else None
    )
    return {
        "id": id_,
        "name": name,
        "description": name.upper(),
        "category": "cost_optimized",
        "cores": cores,
        "memory": memory,
        "disk": disk,
        "deprecated": deprecated is not None,
        "deprecation": deprecation,
        "prices": [
            {
                "location": location,
                "price_hourly": {"net": "0.0060", "gross": "0.0071"},
                "price_monthly": {"net": "3.4900", "gross": "4.1500"},
                "included_traffic": 21990232555520,
                "price_per_tb_traffic": {"net": "1.0000", "gross": "1.1900"},
            }
            for _, location, *_ in LOCATIONS
        ],
        "storage_type": "local",
        "cpu_type": "shared",
        "architecture": "x86",
        "locations": [
            {
                "id": lid,
                "name": lname,
                "deprecation": deprecation,
                "available": True,
                "recommended": deprecated is None,
            }
            for lid, lname, *_ in LOCATIONS
        ],
    }


def datacenter_view(name: str) -> dict[str, Any]:
    id_, name, location = next(item for item in DATACENTERS if item[1] == name)
    types = [item[0] for item in SERVER_TYPES]
    return {
        "id": id_,
        "name": name,
        "description": f"{location_view(location)['city']} DC",
        "location": location_view(location),
        "server_types": {"supported": types, "available": types, "available_for_migration": types},
    }


def datacenter_of(location: str) -> str:
    return next(name for _, name, where in DATACENTERS if where == location)


def image_view(name: str, deprecated: str | None = None) -> dict[str, Any]:
    id_, name, flavor, version, description = next(item for item in IMAGES if item[1] == name)
    return {
        "id": id_,
        "type": "system",
        "status": "available",
        "name": name,
        "description": description,
        "image_size": None,
        "disk_size": 5,
        "created": CREATED,
        "created_from": None,
        "bound_to": None,
        "os_flavor": flavor,
        "os_version": version,
        "rapid_deploy": True,
        "protection": {"delete": False},
        # The timestamp field, and the object hcloud 2.27 reads (Hetzner's changelog of 2026-09-08
        # announces the timestamp's removal in favour of `deprecation`).
        "deprecated": deprecated,
        "deprecation": {"announced": deprecated, "unavailable_after": "2027-12-31T00:00:00+00:00"}
        if deprecated
        else None,
        "deleted": None,
        "labels": {},
        "architecture": "x86",
    }
