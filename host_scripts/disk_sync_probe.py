"""Runs ON THE HOST (python3 reads it on stdin): time how long a disk takes to sync small writes.

    python3 - PATH WRITES BLOCK_BYTES STALL_BOUND_MS TIME_CAP_SECONDS

The way etcd's guidance measures a disk for its write-ahead log (fio --rw=write
--ioengine=sync --fdatasync=1 --bs=2300): small sequential writes to a new file in
PATH, each followed by fdatasync; only the fdatasync is timed. It stops after WRITES
writes, after TIME_CAP_SECONDS, or as soon as one sync has taken STALL_BOUND_MS (a sync
still running at that bound is abandoned, not waited for). The test file is always
removed. PATH is created (mode 0700) when missing, as Longhorn would create it.

Prints one JSON object: {"latencies_ms": [...], "stalled_ms": null or the ms a sync had
run when it was abandoned, "seconds": ..., "created_path": bool, "filesystem": ...}.
Exit 2 with a message on stderr when PATH cannot take a test file.

Written for every Python 3 a supported host has (3.6 on RHEL 8's platform-python): no
dataclasses, no subscripted annotations.
"""

import json
import os
import sys
import threading
import time

POLL_SECONDS = 0.02


class Probe:
    """The writes, done on a thread of their own so a stuck sync can be abandoned."""

    def __init__(self, fd: int, writes: int, block: bytes, stall_bound_s: float, time_cap_s: float) -> None:
        self.fd = fd
        self.writes = writes
        self.block = block
        self.stall_bound_s = stall_bound_s
        self.time_cap_s = time_cap_s
        self.latencies_ms = []  # type: list
        self.sync_started = None  # type: object
        self.error = None  # type: object
        self.done = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        try:
            for _ in range(self.writes):
                os.write(self.fd, self.block)
                begin = time.monotonic()
                self.sync_started = begin
                os.fdatasync(self.fd)
                elapsed = time.monotonic() - begin
                self.sync_started = None
                self.latencies_ms.append(round(elapsed * 1000.0, 3))
                if elapsed >= self.stall_bound_s or time.monotonic() - started >= self.time_cap_s:
                    break
        except OSError as error:
            self.error = error
        finally:
            self.done.set()


def filesystem_of(path: str) -> str:
    """The mount (device and type) PATH lives on, from /proc/self/mounts."""
    best = ("", "?", "?")
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount_point = fields[1].replace("\\040", " ")
                inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best[0]):
                    best = (mount_point, fields[0], fields[2])
    except OSError:
        return "?"
    return f"{best[1]} ({best[2]} on {best[0]})"


def main(argv: list) -> int:
    path, writes, block_bytes = argv[0], int(argv[1]), int(argv[2])
    stall_bound_s, time_cap_s = float(argv[3]) / 1000.0, float(argv[4])
    created = False
    if not os.path.isdir(path):
        if os.path.exists(path):
            sys.stderr.write(f"{path} exists and is not a directory\n")
            return 2
        os.makedirs(path, 0o700)
        created = True
    test_file = os.path.join(path, f".hk3s-disk-probe-{os.getpid()}")
    try:
        fd = os.open(test_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        sys.stderr.write(f"cannot create a test file in {path}: {error.strerror}\n")
        return 2
    probe = Probe(fd, writes, b"\0" * block_bytes, stall_bound_s, time_cap_s)
    started = time.monotonic()
    stalled_ms = None
    try:
        worker = threading.Thread(target=probe.run, daemon=True)
        worker.start()
        while not probe.done.wait(POLL_SECONDS):
            sync_started = probe.sync_started
            if isinstance(sync_started, float) and time.monotonic() - sync_started >= stall_bound_s:
                stalled_ms = round((time.monotonic() - sync_started) * 1000.0, 3)
                break
        # What was measured up to now: the abandoned sync may still finish while the file is removed.
        latencies_ms = list(probe.latencies_ms)
        seconds = round(time.monotonic() - started, 3)
    finally:
        # Removed whatever happened. With a sync still stuck on it this waits for that sync on
        # filesystems that lock the file for it (FUSE does); a disk that never answers hangs
        # here, and the caller's deadline names it.
        try:
            os.unlink(test_file)
        except OSError as error:
            sys.stderr.write(f"cannot remove the test file {test_file}: {error.strerror}\n")
    if probe.done.is_set():
        os.close(fd)
    if probe.error is not None:
        sys.stderr.write(f"writing the test file in {path} failed: {probe.error}\n")
        return 2
    result = {
        "latencies_ms": latencies_ms,
        "stalled_ms": stalled_ms,
        "seconds": seconds,
        "created_path": created,
        "filesystem": filesystem_of(path),
    }
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    if stalled_ms is not None:
        # A sync that never returns keeps its thread (and so the process) alive: leave now.
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
