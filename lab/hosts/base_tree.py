"""The base tree: a Debian bookworm tree built once by debootstrap into
``<cache>/base-<hash of the package list>`` and shared read-only by every lab host
(each overlays it with a directory of its own). A tree with extra packages (a host with UFW,
firewalld, ...) is the plain tree copied, with those packages installed by its own apt."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from lab.hosts.processes import _flock, _run, _safe_rmtree, _umount_all

log = logging.getLogger("lab.hosts")

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
#: Packages of the base tree, on top of debootstrap's minbase.  No firewall:
#: tests install ufw/firewalld through NAT, or ask for a variant base.
BASE_PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "openssh-sftp-server",  # SFTP-based file copies (e.g. pulumi-command CopyToRemote)
    "iproute2",
    "iputils-ping",
    "curl",
    "ca-certificates",
    "kmod",
    "procps",
    "nftables",
    "iptables",  # k3s and kube-proxy use it; UFW sits on it
    "python3",
    "sudo",
    "netbase",  # /etc/services, /etc/protocols
    "netcat-openbsd",
    # Real cloud-init (Debian's package, 22.4.2 in bookworm) for hosts that stand in for Hetzner
    # servers (lab/hcloud_standin.py): it runs the user data the program gives a server. Off in
    # every host (/etc/cloud/cloud-init.disabled, below) until a host's own tree turns it on.
    "cloud-init",
    # debootstrap resolves no virtual package: python3-cryptography (cloud-init, through
    # python3-oauthlib) needs python3-cffi-backend-api-min/-max, which only this one provides.
    "python3-cffi-backend",
)
#: Bump when the post-processing of the base tree changes.
BASE_LAYOUT = 1


def base_packages(extra_packages: Iterable[str] = ()) -> tuple[str, ...]:
    return tuple(sorted(set(BASE_PACKAGES) | set(extra_packages)))


def base_path(cache_dir: Path, mirror: str = MIRROR, extra_packages: Iterable[str] = ()) -> Path:
    """Where the base tree for this package set lives (built or not)."""
    packages = base_packages(extra_packages)
    key = json.dumps({"suite": SUITE, "mirror": mirror, "packages": packages, "layout": BASE_LAYOUT})
    return cache_dir / f"base-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def ensure_base(cache_dir: Path, mirror: str = MIRROR, extra_packages: Iterable[str] = ()) -> Path:
    """The base tree for this package set under `cache_dir`, built the first time: the plain tree by
    debootstrap, a tree with extra packages from the plain one."""
    extra = tuple(extra_packages)
    target = base_path(cache_dir, mirror, extra)
    if (target / ".hk3s-lab-base.json").exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    extra_only = sorted(set(base_packages(extra)) - set(BASE_PACKAGES))
    # A tree with extra packages is the plain tree plus those packages: copied and installed by
    # apt, not debootstrapped again (about 11 CPU-seconds instead of 90 for one package). The
    # plain tree first, before the build lock (flock is not re-entrant).
    plain = ensure_base(cache_dir, mirror) if extra_only else None
    with _flock(cache_dir / ".build.lock"):
        if (target / ".hk3s-lab-base.json").exists():
            return target
        packages = base_packages(extra)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        _safe_rmtree(tmp)
        for stale in cache_dir.glob(f".{target.name}.tmp-*"):
            _safe_rmtree(stale)
        started = time.monotonic()
        try:
            if plain is not None:
                log.info("building base %s (base %s + %s)", target.name, plain.name, " ".join(extra_only))
                _run(["cp", "-a", "--reflink=auto", plain, tmp], timeout=600)
                _install_extra(tmp, extra_only)
            else:
                log.info("building base %s (debootstrap %s, %d packages)", target.name, SUITE, len(packages))
                debs = cache_dir / "debs"
                debs.mkdir(exist_ok=True)
                _run(
                    [
                        "debootstrap",
                        "--variant=minbase",
                        f"--include={','.join(packages)}",
                        f"--cache-dir={debs}",
                        SUITE,
                        tmp,
                        mirror,
                    ],
                    timeout=1800,
                )
            _umount_all(tmp)
            _finish_base(tmp, mirror, packages)
        except BaseException:
            with contextlib.suppress(Exception):
                _safe_rmtree(tmp)
            raise
        os.rename(tmp, target)
        log.info("base %s ready in %.0fs", target.name, time.monotonic() - started)
    return target


def _install_extra(root: Path, packages: Sequence[str]) -> None:
    """Install `packages` into the copied tree at `root` with its own apt, as an administrator
    would on the host: /proc and /dev bound, the machine's resolver, no service started
    (policy-rc.d answers 101, as debootstrap's chroot does), no recommended packages (debootstrap's
    --include adds none either). The mounts and the two borrowed files go away after."""
    resolv = root / "etc/resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    link = os.readlink(resolv) if resolv.is_symlink() else None
    policy = root / "usr/sbin/policy-rc.d"
    try:
        for mount in ("proc", "dev"):
            _run(["mount", "--bind", f"/{mount}", root / mount])
        resolv.unlink(missing_ok=True)
        resolv.write_bytes(Path("/etc/resolv.conf").read_bytes())
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        environment = ["env", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"]
        _run(["chroot", root, *environment, "apt-get", "-q", "update"], timeout=600)
        _run(
            ["chroot", root, *environment, "apt-get", "-q", "install", "-y", "--no-install-recommends", *packages],
            timeout=1200,
        )
        _run(["chroot", root, "apt-get", "clean"], timeout=120)
    finally:
        _umount_all(root)
        policy.unlink(missing_ok=True)
        resolv.unlink(missing_ok=True)
        if link is not None:
            resolv.symlink_to(link)
        elif saved is not None:
            resolv.write_bytes(saved)
    for lists in (root / "var/lib/apt/lists").glob("*_dists_*"):
        lists.unlink()


def _finish_base(root: Path, mirror: str, packages: Sequence[str]) -> None:
    mirror_root = mirror.rstrip("/")
    security = SECURITY_MIRROR if mirror_root == MIRROR else mirror_root + "-security"
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror_root} {SUITE} main\n"
        f"deb {mirror_root} {SUITE}-updates main\n"
        f"deb {security} {SUITE}-security main\n"
    )
    # Per-host identity is written at boot: no shared host keys or machine-id.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    with contextlib.suppress(FileNotFoundError):
        (root / "var/lib/dbus/machine-id").unlink()
    (root / "etc/hostname").write_text("localhost\n")
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    # Timers that would take the apt lock from under tests.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer"):
        mask = root / "etc/systemd/system" / unit
        with contextlib.suppress(FileNotFoundError):
            mask.unlink()
        mask.symlink_to("/dev/null")
    # cloud-init's systemd generator leaves cloud-init.target out of the boot while this file
    # exists (cloud-init's documented "disable cloud-init" switch): a plain lab host boots as it
    # did without the package, and a host seeded as a Hetzner server removes it in its own layer.
    (root / "etc/cloud").mkdir(parents=True, exist_ok=True)
    (root / "etc/cloud/cloud-init.disabled").write_text("")
    conf_dir = root / "etc/ssh/sshd_config.d"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "10-hk3s-lab.conf").write_text(
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
    )
    (root / ".hk3s-lab-base.json").write_text(
        json.dumps(
            {
                "suite": SUITE,
                "mirror": mirror,
                "packages": list(packages),
                "layout": BASE_LAYOUT,
                "built": time.time(),
            }
        )
    )
