"""A lab host whose Longhorn disk syncs slowly, for real (LAB ONLY: never shipped).

A host with ``HostSpec(disk_sync_delay_ms=...)`` gets, in its directory on the machine
(``<host dir>/slow-disk``):

* ``backing/``: a tmpfs (:data:`BACKING_SIZE`) where the files really live;
* ``mnt/``: ``slow-disk-fs`` (``lab/slow_disk_fs``, built by ``lab/build/slow_disk.sh``),
  a FUSE passthrough view of ``backing/`` whose every fsync/fdatasync first waits, bound
  read-write into the host at ``/var/lib/longhorn``;
* ``delay``: the control file, ``DELAY_MS [STALL_MS EVERY]``, which the daemon reads at
  every sync, so :meth:`SlowDisk.set_delay` makes the disk slower or faster while the host
  runs (every EVERY-th sync waits STALL_MS instead: a disk that stalls now and then).

What it models: how long a sync of a small write takes as the writer sees it (the
measure the disk probe takes, as etcd's guidance measures a disk), fixed or with periodic
stalls, changeable at run time. With no delay it is a fast disk: the backing is memory,
so a sync costs only the FUSE round trip.

What it does not model: write and read latency (they go to memory at its speed),
throughput or IOPS limits, queueing (concurrent syncs each wait their own delay), jitter,
I/O errors, a full disk beyond the tmpfs size, or data surviving a crash (the backing is
memory and goes with the lab).

A test can also start one on its own (``SlowDisk(<a directory under the lab's run directory>)``),
put it into a running host at any path (:meth:`SlowDisk.attach`: a bind of the FUSE mount made
in the host's mount namespace, as a CSI driver's mount would be there) and freeze it
(:meth:`SlowDisk.freeze`: the daemon stopped with SIGSTOP). A frozen FUSE filesystem answers
no request: a stat of it, or a `umount` that resolves the path first, waits (killable, as a
FUSE request is) until it is thawed, as a filesystem whose block device stopped answering
does (a Longhorn volume whose iSCSI target went with its instance manager).

Teardown: the lab's teardown kills the daemon (its command line names the lab's run
directory) and unmounts ``mnt/`` and ``backing/`` with every other mount under it; its
leftovers check lists any mount or process still there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DISK_PATH_IN_HOST = "/var/lib/longhorn"
BINARY_NAME = "slow-disk-fs"
DAEMON_NICENESS = -10
FUSE_TYPE = "fuse.slow-disk"  # the daemon mounts with Name "slow-disk"
BACKING_SIZE = "256m"
MOUNT_WAIT_SECONDS = 10.0


class SlowDiskError(RuntimeError):
    """The slow disk could not be set up (binary missing, mount failed)."""


def binary(cache_dir: Path) -> Path:
    """The daemon lab/build/slow_disk.sh builds."""
    return cache_dir / "bin" / BINARY_NAME


def _fstype(mount_point: Path) -> str | None:
    target = os.fspath(mount_point)
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if left.split()[4] == target:
            found = right.split()[0]
    return found


@dataclass(frozen=True)
class SlowDisk:
    """One host's slow disk, kept in ``directory`` on the machine."""

    directory: Path

    @property
    def backing(self) -> Path:
        return self.directory / "backing"

    @property
    def mount_point(self) -> Path:
        return self.directory / "mnt"

    @property
    def control(self) -> Path:
        return self.directory / "delay"

    @property
    def log(self) -> Path:
        return self.directory / "daemon.log"

    def nspawn_bind(self) -> str:
        """systemd-nspawn's argument that puts the disk at the host's Longhorn path."""
        return f"--bind={self.mount_point}:{DISK_PATH_IN_HOST}"

    def is_mounted(self) -> bool:
        return _fstype(self.mount_point) == FUSE_TYPE

    def set_delay(self, delay_ms: float, stall_ms: float = 0.0, stall_every: int = 0) -> None:
        """Every later sync waits `delay_ms`; with `stall_every`, every stall_every-th waits `stall_ms`."""
        if delay_ms < 0 or stall_ms < 0 or stall_every < 0:
            raise ValueError("delays and counts are not negative")
        line = f"{delay_ms:g}" + (f" {stall_ms:g} {stall_every}" if stall_every else "")
        temporary = self.control.with_suffix(".tmp")
        temporary.write_text(line + "\n")
        os.replace(temporary, self.control)

    def start(self, cache_dir: Path, delay_ms: float) -> None:
        """Mount the backing tmpfs and the FUSE view over it (idempotent)."""
        daemon = binary(cache_dir)
        if not daemon.exists():
            raise SlowDiskError(f"{daemon} is missing; run lab/setup.sh (lab/build/slow_disk.sh builds it)")
        if self.is_mounted():
            return
        for path in (self.backing, self.mount_point):
            path.mkdir(parents=True, exist_ok=True)
        if _fstype(self.backing) != "tmpfs":
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={BACKING_SIZE},mode=0755", "tmpfs", str(self.backing)],
                check=True,
            )
        self.set_delay(delay_ms)
        with open(self.log, "ab") as log:
            # A real disk's syncs do not wait for a CPU; this daemon, which stands in for the disk,
            # must not wait behind the lab's other work either, or a busy machine (three test
            # modules side by side) reads a disk with no delay as one over the 10 ms threshold
            # (a CI run judged test_longhorn_copies's fast worker slow). So it runs at a higher
            # priority than everything else here (nice -10, inherited by every thread it starts).
            process = subprocess.Popen(
                [
                    "nice",
                    "-n",
                    str(DAEMON_NICENESS),
                    str(daemon),
                    "--backing",
                    str(self.backing),
                    "--mount",
                    str(self.mount_point),
                    "--control",
                    str(self.control),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this process, as the hosts' supervisors do
                close_fds=True,
            )
        # Reap it when it ends while this process lives (it is our child).
        threading.Thread(target=process.wait, daemon=True).start()
        deadline = time.monotonic() + MOUNT_WAIT_SECONDS
        while not self.is_mounted():
            if process.poll() is not None:
                raise SlowDiskError(f"{BINARY_NAME} exited ({process.returncode}): {self.log.read_text()[-500:]}")
            if time.monotonic() > deadline:
                process.kill()
                raise SlowDiskError(f"{BINARY_NAME} did not mount {self.mount_point}; see {self.log}")
            time.sleep(0.02)


# Run in a child process (setns needs a single thread): clone the FUSE mount (open_tree), enter
# the host's mount namespace (setns) and attach the clone there (move_mount). The syscall numbers
# are the same on every architecture the lab runs on (Linux's unified numbers since 5.2).
ATTACH_SCRIPT = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
OPEN_TREE_CLONE, AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH, CLONE_NEWNS = 1, -100, 4, 0x00020000
source, namespace, target = sys.argv[1:4]
tree = libc.syscall(428, AT_FDCWD, source.encode(), OPEN_TREE_CLONE | os.O_CLOEXEC)
if tree < 0:
    raise OSError(ctypes.get_errno(), f"open_tree {source}")
if libc.setns(os.open(namespace, os.O_RDONLY), CLONE_NEWNS) != 0:
    raise OSError(ctypes.get_errno(), f"setns {namespace}")
os.makedirs(target, exist_ok=True)
if libc.syscall(429, tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH) != 0:
    raise OSError(ctypes.get_errno(), f"move_mount {target}")
"""


def daemon_pid(disk: SlowDisk) -> int:
    """The pid of the daemon serving `disk`."""
    wanted = ["--mount", os.fspath(disk.mount_point)]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args and args[0].endswith(BINARY_NAME) and any(args[i : i + 2] == wanted for i in range(len(args))):
            return int(proc.name)
    raise SlowDiskError(f"no {BINARY_NAME} serves {disk.mount_point}")


def attach(disk: SlowDisk, leader_pid: int, target: str) -> None:
    """Bind `disk`'s FUSE mount at `target` inside the host whose init is `leader_pid`."""
    subprocess.run(
        [sys.executable, "-c", ATTACH_SCRIPT, os.fspath(disk.mount_point), f"/proc/{leader_pid}/ns/mnt", target],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )


def freeze(disk: SlowDisk) -> None:
    """Stop the daemon: every request to the filesystem waits until `thaw`."""
    os.kill(daemon_pid(disk), signal.SIGSTOP)


def thaw(disk: SlowDisk) -> None:
    os.kill(daemon_pid(disk), signal.SIGCONT)


def of_host_dir(host_dir: Path) -> SlowDisk:
    """The slow disk of the host kept in `host_dir`."""
    return SlowDisk(host_dir / "slow-disk")
