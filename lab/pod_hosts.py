"""What a lab host needs to run pods (LAB ONLY): a cgroup subtree of its own, plain binds, kernel files.

A host whose :class:`lab.hosts.HostSpec` says ``pods=True`` runs a real containerd, runc and
kubelet under the k3s stand-in. On this machine kind (cgroup v1 "hybrid", PID 1 not systemd;
see ``../shared/guide/lab-pods.md``) that needs, beyond a plain host:

* **its own cgroup subtree, writable**: systemd-nspawn mounts the machine's cgroup
  controllers read-only inside a host. For every hierarchy the lab creates
  ``<launcher's cgroup>/<lab id>-<host>`` (cpuset gets its parent's cpus and mems), mounts a
  tmpfs view in the host's directory with each new directory bound at ``<view>/<hierarchy>``
  (``<dir>/payload`` for ``systemd`` and ``unified``: in hybrid mode nspawn puts itself in
  ``supervisor`` and the container in ``payload``), binds that view at ``/sys/fs/cgroup`` and
  starts the host's supervisor inside every new directory, so nspawn and the container
  inherit them and the container's cgroup root matches the view. Teardown removes the
  directories bottom-up (:func:`remove_cgroups`).
* **plain directories** bound at ``/var/lib/containerd`` and ``/var/lib/kubelet``: overlayfs
  snapshots on the host's overlay root fail ("overlay ... invalid argument").
* ``/dev/kmsg`` read-only (the kubelet's OOM watcher), the ``@keyring`` system calls (runc
  joins a session keyring), and files holding the values the kubelet insists on, bound over
  ``/proc/sys/kernel/panic``, ``kernel/panic_on_oops`` and ``vm/overcommit_memory`` at boot by
  a unit inside the host (the real entries are machine-wide and stay read-only).
* **the runtime**: the binaries ``lab/build/pod_runtime.sh`` and ``lab/build/kube.sh`` built,
  bound read-only at ``/var/lib/rancher/k3s/data/current/bin``, where a real k3s binary
  extracts its bundled containerd, runc, CNI plugins and tools. The k3s stand-in runs the
  runtime only when it finds it there, so plain hosts behave as before. A real k3s binary
  runs the kubelet compiled into it, so its Node reports that binary's version; the stand-in
  cannot embed one, so every release it is stamped with (``lab/build/k3s_standin.sh
  --print-releases``) has its kubelet at ``kubelets/<k3s version>/kubelet`` there, and the
  stand-in runs its own release's (and stops with an error when it is missing).
* **Longhorn's CSI node plugin** (the lab's stand-in, ``lab/longhorn_standin/csi``, built by
  ``lab/build/pod_runtime.sh``), bound read-only at ``/usr/local/lib/hk3s-lab/`` and run by the
  unit ``hk3s-lab-longhorn-csi@<k3s unit>.service``, bound to ``k3s.service`` and
  ``k3s-agent.service`` (``BindsTo=`` and ``After=``, pulled in by each through a ``.wants``
  link): it runs while k3s runs and stops with it, so a fence and a wipe leave none of it
  behind, as they leave no pod. There is no ``/usr/local/bin/k3s-killall.sh``: only k3s's install
  script writes one, and the product installs k3s without it, so its fence and wipe do that work
  with their own steps, here as on its hosts. On a real node it is a DaemonSet pod (``longhorn-csi-plugin``);
  here it is not, because that pod would need Longhorn's images, and a DaemonSet would never be
  ready on the lab's plain hosts, which run no pods.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# In hybrid mode nspawn splits its cgroup in these two hierarchies into supervisor/payload.
SPLIT_HIERARCHIES = ("systemd", "unified")
RUNTIME_BIN_IN_HOST = "/var/lib/rancher/k3s/data/current/bin"
CONTAINERD_DIR_IN_HOST = "/var/lib/containerd"
KUBELET_DIR_IN_HOST = "/var/lib/kubelet"
# Kernel settings the kubelet reads and refuses to run without (protectKernelDefaults off it
# still checks them): bound per host as files, never written on the machine.
KERNEL_FILES = {"kernel/panic": "10", "kernel/panic_on_oops": "1", "vm/overcommit_memory": "1"}
RUNTIME_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "crictl")
#: Under the runtime (and the cache's bin/): one directory per k3s release holding its kubelet.
KUBELETS = "kubelets"
CSI_PLUGIN = "longhorn-csi-plugin"
CSI_PLUGIN_DIR_IN_HOST = "/usr/local/lib/hk3s-lab"
CSI_PLUGIN_UNIT = "hk3s-lab-longhorn-csi@.service"
#: The k3s units that run the kubelet (the server's and the agent's).
K3S_UNITS = ("k3s", "k3s-agent")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


class PodHostError(RuntimeError):
    """A pod-capable host cannot be prepared (missing build, unusual cgroup layout)."""


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy of the machine, e.g. ``memory`` at ``/sys/fs/cgroup/memory``."""

    name: str
    mount_point: Path
    version: int
    controllers: tuple[str, ...]


def hierarchies() -> list[Hierarchy]:
    """The cgroup hierarchies mounted under /sys/fs/cgroup, as this process sees them."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        mount_point = Path(left.split()[4])
        fstype, _source, options = right.split()[:3]
        if mount_point.parent != CGROUP_ROOT or fstype not in ("cgroup", "cgroup2"):
            continue
        # Super options: "rw,cpu", "rw,xattr,name=systemd", ...; matched against /proc/self/cgroup.
        version = 2 if fstype == "cgroup2" else 1
        found.append(Hierarchy(mount_point.name, mount_point, version, tuple(options.split(","))))
    if not any(h.version == 1 for h in found):
        raise PodHostError("pod-capable lab hosts are built for the cgroup v1 hybrid layout; none found")
    return found


def _own_cgroup(hierarchy: Hierarchy) -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _num, names, path = line.split(":", 2)
        if hierarchy.version == 2 and names == "":
            return path
        if hierarchy.version == 1 and names and set(names.split(",")) <= set(hierarchy.controllers):
            return path
    raise PodHostError(f"this process is in no cgroup of hierarchy {hierarchy.name}")


def create_cgroups(tag: str) -> dict[str, str]:
    """Create ``<own cgroup>/<tag>`` in every hierarchy; returns hierarchy name -> absolute directory."""
    dirs: dict[str, str] = {}
    for hierarchy in hierarchies():
        parent = hierarchy.mount_point / _own_cgroup(hierarchy).lstrip("/")
        path = parent / tag
        path.mkdir(exist_ok=True)
        if "cpuset" in hierarchy.controllers:
            for name in ("cpuset.cpus", "cpuset.mems"):
                (path / name).write_text((parent / name).read_text())
        if hierarchy.name in SPLIT_HIERARCHIES:
            (path / "payload").mkdir(exist_ok=True)
        dirs[hierarchy.name] = str(path)
    return dirs


def mount_cgroup_view(view: Path, dirs: dict[str, str]) -> None:
    """A tmpfs at ``view`` with each host cgroup directory bound at ``view/<hierarchy>`` (idempotent)."""
    if os.path.ismount(view):
        return
    view.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(view)], check=True)
    for name, directory in dirs.items():
        source = Path(directory) / "payload" if name in SPLIT_HIERARCHIES else Path(directory)
        (view / name).mkdir()
        subprocess.run(["mount", "--bind", str(source), str(view / name)], check=True)
    # Mirror the machine's aliases (e.g. cpu,cpuacct -> cpu) so tools find every controller.
    for entry in CGROUP_ROOT.iterdir():
        if entry.is_symlink() and not (view / entry.name).exists():
            (view / entry.name).symlink_to(os.readlink(entry))


def remove_cgroups(dirs: dict[str, str], timeout: float = 10.0) -> list[str]:
    """Remove each subtree bottom-up; returns the directories still present after ``timeout``.

    A directory goes once its last process has left (the container's processes die with
    its PID namespace, a little after its init).
    """
    deadline = time.monotonic() + timeout
    while True:
        left: list[str] = []
        for directory in dirs.values():
            root = Path(directory)
            if not root.exists():
                continue
            for current, _subdirs, _files in os.walk(root, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(current)
            if root.exists():
                left.append(str(root))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


KERNEL_FILES_IN_HOST = "/etc/hk3s-lab/proc-sys"
KERNEL_FILES_UNIT = "hk3s-lab-proc-sys.service"


def install_kernel_files(root: Path) -> None:
    """Files holding the kernel values the kubelet wants, and a unit that binds them over
    the /proc/sys entries at boot (inside the host only; nspawn cannot bind over /proc/sys
    from the machine: it resolves such sources inside the container)."""
    directory = root / KERNEL_FILES_IN_HOST.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    mounts = []
    for entry, value in KERNEL_FILES.items():
        name = entry.replace("/", ".")
        (directory / name).write_text(value + "\n")
        mounts.append(f"ExecStart=/bin/mount --bind -o ro {KERNEL_FILES_IN_HOST}/{name} /proc/sys/{entry}\n")
    unit = root / "etc/systemd/system" / KERNEL_FILES_UNIT
    unit.write_text(
        "[Unit]\n"
        "Description=hk3s lab: the kernel values the kubelet checks (LAB ONLY)\n"
        "DefaultDependencies=no\n"
        "Before=sysinit.target\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n" + "".join(mounts) + "[Install]\n"
        "WantedBy=sysinit.target\n"
    )
    wants = root / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / KERNEL_FILES_UNIT
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{KERNEL_FILES_UNIT}")


def install_csi_plugin_unit(root: Path) -> None:
    """The unit that runs Longhorn's CSI node plugin while k3s runs (see the module docstring).

    ``BindsTo=`` with ``After=``: the plugin stops when the k3s unit stops, and does not start
    while that unit is not active (a fenced agent's unit, skipped by its condition, keeps the
    plugin down too). The node ID is the host name, which is the node's name in the lab."""
    units = root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    (units / CSI_PLUGIN_UNIT).write_text(
        "[Unit]\n"
        "Description=hk3s lab: Longhorn's CSI node plugin (stand-in) beside %i (LAB ONLY)\n"
        "BindsTo=%i.service\n"
        "After=%i.service\n"
        "[Service]\n"
        f"ExecStart={CSI_PLUGIN_DIR_IN_HOST}/{CSI_PLUGIN} --node-id=%H\n"
        "Restart=on-failure\n"
        "RestartSec=2\n"
    )
    for unit in K3S_UNITS:
        wants = units / f"{unit}.service.wants"
        wants.mkdir(parents=True, exist_ok=True)
        link = wants / CSI_PLUGIN_UNIT.replace("@.", f"@{unit}.")
        if not link.is_symlink():
            link.symlink_to(f"/etc/systemd/system/{CSI_PLUGIN_UNIT}")


def assemble_csi_plugin(cache_dir: Path, target: Path) -> Path:
    """A directory holding the CSI node plugin (a hard link into the build cache) to bind into hosts."""
    source = cache_dir / "bin" / CSI_PLUGIN
    if not source.exists():
        raise PodHostError(f"Longhorn's CSI node plugin not built ({source} missing): run lab/build/pod_runtime.sh")
    target.mkdir(parents=True, exist_ok=True)
    dest = target / CSI_PLUGIN
    dest.unlink(missing_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)
    return target


@functools.cache
def k3s_releases() -> tuple[str, ...]:
    """The k3s versions the lab's stand-in binaries are stamped with (k3s, k3s-patch, k3s-minor)."""
    out = subprocess.run(
        ["bash", str(Path(__file__).resolve().parent / "build" / "k3s_standin.sh"), "--print-releases"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(line.split()[1] for line in out.splitlines())


def _runtime_files(cache_dir: Path) -> list[tuple[Path, Path]]:
    """(file in the build cache, its path under the runtime directory) for every runtime file."""
    bin_dir = cache_dir / "bin"
    files = [(bin_dir / b, Path(b)) for b in RUNTIME_BINARIES]
    files += [(cache_dir / "cni" / "bin" / p, Path(p)) for p in CNI_PLUGINS]
    kubelets = [Path(KUBELETS, release, "kubelet") for release in k3s_releases()]
    return files + [(bin_dir / kubelet, kubelet) for kubelet in kubelets]


def assemble_runtime(cache_dir: Path, target: Path) -> Path:
    """A directory of the runtime's binaries (hard links into the build cache) to bind into hosts."""
    files = _runtime_files(cache_dir)
    missing = [str(source) for source, _ in files if not source.exists()]
    if missing:
        raise PodHostError(
            f"pod runtime not built ({', '.join(missing)} missing): run lab/build/pod_runtime.sh and lab/build/kube.sh"
        )
    for source, name in files:
        dest = target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        try:
            os.link(source, dest)
        except OSError:
            shutil.copy2(source, dest)
    return target


def image_archives(cache_dir: Path) -> list[Path]:
    """The image tarballs ``lab/build/pod_runtime.sh`` built (pause, busybox)."""
    images = sorted((cache_dir / "images").glob("*.tar"))
    if not images:
        raise PodHostError(f"no images in {cache_dir / 'images'}: run lab/build/pod_runtime.sh")
    return images


def runtime_missing(cache_dir: Path) -> str | None:
    """Why pod-capable hosts cannot be made here (the runtime or its images not built), or None."""
    files = [source for source, _ in _runtime_files(cache_dir)] + [cache_dir / "bin" / CSI_PLUGIN]
    missing = [str(source) for source in files if not source.exists()]
    if missing:
        return f"pod runtime not built: {', '.join(missing)} missing (run lab/setup.sh)"
    try:
        image_archives(cache_dir)
    except PodHostError as err:
        return str(err)
    return None


def busybox_image() -> str:
    """The busybox image's reference, as ``lab/build/pod_runtime.sh`` names it."""
    out = subprocess.run(
        ["bash", str(Path(__file__).resolve().parent / "build" / "pod_runtime.sh"), "--print-images"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("busybox.tar "))


def place_airgap_images(host_root: Path, cache_dir: Path) -> None:
    """The image tarballs into k3s's air-gap folder of the host whose root is ``host_root``, as an
    air-gapped operator does (before k3s is installed)."""
    folder = host_root / "var/lib/rancher/k3s/agent/images"
    folder.mkdir(parents=True, exist_ok=True)
    for archive in image_archives(cache_dir):
        shutil.copyfile(archive, folder / f".{archive.name}.part")
        os.replace(folder / f".{archive.name}.part", folder / archive.name)


def nspawn_args(host_dir: Path, view: Path, runtime: Path, csi_plugin: Path) -> list[str]:
    """systemd-nspawn arguments that make a host pod-capable (see the module docstring)."""
    args = [
        f"--bind-ro={csi_plugin}:{CSI_PLUGIN_DIR_IN_HOST}",
        f"--bind={view}:/sys/fs/cgroup",
        f"--bind={host_dir / 'containerd'}:{CONTAINERD_DIR_IN_HOST}",
        f"--bind={host_dir / 'kubelet'}:{KUBELET_DIR_IN_HOST}",
        "--bind-ro=/dev/kmsg",
        f"--bind-ro={runtime}:{RUNTIME_BIN_IN_HOST}",
        "--system-call-filter=@keyring",
    ]
    return args
