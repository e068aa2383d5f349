"""Run this program against lab hosts through the real Pulumi CLI and the
Automation API: a copy of the project with a generated stack file, a local
file backend, the lab's CLI. LAB ONLY: used by the lab tests, the benchmarks
and the demo (lab/demo.py); the product never imports it."""

from __future__ import annotations

import compileall
import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto

from lab.hosts import Host, HostSpec, Lab
from operator_api import ClusterStack

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("HK3S_LAB_CACHE", "/var/cache/hk3s-lab"))
BIN = CACHE / "bin"
KUBE_BIN_IN_HOST = "/opt/lab-kube/bin"
#: The plugin cache lab/build/k8s_provider.sh installs the real Kubernetes provider into; every
#: lab stack sees its plugins (linked, not copied: the provider is 300 MB).
LAB_PLUGINS = CACHE / "pulumi-home" / "plugins"
#: Longhorn's stand-in chart (lab/longhorn_standin), installed through storage.longhorn_chart.
LONGHORN_STANDIN_CHART = Path(__file__).resolve().parent / "longhorn_standin" / "chart"
# Longhorn's packages baked into the lab base so joins need not download them every time;
# node_prepare.sh still checks them (one lab test joins a host without them).
LONGHORN_PACKAGES = ("open-iscsi", "nfs-common")
PARALLEL = 32


#: What lab/setup.sh builds into BIN that a stack on lab hosts needs.
STACK_BINARIES = ("pulumi", "pulumi-language-python", "k3s", "k3s.sha256", "kube-apiserver", "kine")


def lab_binaries_missing(names: Sequence[str] = STACK_BINARIES) -> list[str]:
    """Which of `names` lab/setup.sh has not built into BIN."""
    return [name for name in names if not (BIN / name).exists()]


def skip_without_lab_binaries(*names: str) -> None:
    """Skip (a failure under HK3S_LAB_REQUIRED) when lab/setup.sh has not built the binaries
    (`names`, by default those a stack on lab hosts needs)."""
    import pytest  # noqa: PLC0415

    missing = lab_binaries_missing(names or STACK_BINARIES)
    if missing:
        pytest.skip(f"lab binaries missing from {BIN} ({', '.join(missing)}); run lab/setup.sh")


def kubernetes_plugins() -> list[Path]:
    """The Kubernetes provider plugins lab/build/k8s_provider.sh installed into LAB_PLUGINS."""
    return sorted(LAB_PLUGINS.glob("resource-kubernetes-v*/pulumi-resource-kubernetes"))


def hcloud_plugins() -> list[Path]:
    """The hcloud provider plugins lab/build/hcloud_provider.sh installed into LAB_PLUGINS."""
    return sorted(LAB_PLUGINS.glob("resource-hcloud-v*/pulumi-resource-hcloud"))


def skip_without_hcloud_provider() -> None:
    """Skip (a failure under HK3S_LAB_REQUIRED) when lab/setup.sh has not built and installed the
    hcloud provider plugin bridged from Hetzner's Terraform provider (lab/build/hcloud_provider.sh)."""
    import pytest  # noqa: PLC0415

    skip_without_lab_binaries("pulumi", "pulumi-language-python")
    if not hcloud_plugins():
        pytest.skip(f"no hcloud provider plugin in {LAB_PLUGINS}; run lab/setup.sh")


def skip_without_kubernetes_provider() -> None:
    """Skip (a failure under HK3S_LAB_REQUIRED) when lab/setup.sh has not built and installed the
    real Kubernetes provider plugin (lab/build/k8s_provider.sh)."""
    import pytest  # noqa: PLC0415

    skip_without_lab_binaries()
    if not kubernetes_plugins():
        pytest.skip(f"no Kubernetes provider plugin in {LAB_PLUGINS}; run lab/setup.sh")


# A TCP dial from a host: "open" when something answered (a refusal is an answer: no rule dropped
# it), "closed" when nothing did within 3 s (a firewall drops it).
PORT_PROBE = """
import errno, socket, sys
s = socket.socket()
s.settimeout(3)
code = s.connect_ex((sys.argv[1], int(sys.argv[2])))
print("open" if code in (0, errno.ECONNREFUSED) else "closed")
"""


def port_reachable(source: Host, target: Host, port: int) -> bool:
    """Whether `target`'s public address answers on `port` from `source` (see PORT_PROBE)."""
    return source.run(["python3", "-c", PORT_PROBE, target.public_ip or "", str(port)]).stdout.strip() == "open"


def wait_until(what: str, check: Callable[[], bool], timeout: float, diagnose: Callable[[], str] = lambda: "") -> None:
    """Poll `check` every second until it holds; past `timeout`, fail the test naming `what` and
    what `diagnose` says."""
    import pytest  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s\n{diagnose()}")
        time.sleep(1)


def up_or_fail(stack: LabStack) -> auto.UpResult:
    """`up`, or fail the test with the run's last output."""
    import pytest  # noqa: PLC0415

    try:
        return stack.up()
    except auto.CommandError as error:
        pytest.fail(f"pulumi up failed:\n{stack.text()[-6000:]}\n{error}")


def k3s_snapshot(name: str = "k3s") -> tuple[Path, str]:
    """The k3s binary (`name`: k3s, or the stand-in stamped as the next release, k3s-patch or
    k3s-minor) as a file that cannot change under a running test (a rebuild replaces bin/k3s);
    named by its SHA-256."""
    import hashlib  # noqa: PLC0415

    data = (BIN / name).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    path = Path("/var/tmp") / f"hk3s-lab-k3s-{digest[:16]}"
    if not path.exists():
        # Written aside and renamed: a test running beside this one may execute it meanwhile.
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_bytes(data)
        part.chmod(0o755)
        part.replace(path)
    return path, digest


def k3s_version(name: str = "k3s") -> str:
    out = subprocess.run([str(k3s_snapshot(name)[0]), "--version"], capture_output=True, text=True, check=True).stdout
    return out.split()[2]


def k3s_release(name: str = "k3s") -> dict[str, str]:
    """hk3s:cluster's k3s settings for the stand-in binary `name` (see `k3s_snapshot`)."""
    binary, sha256 = k3s_snapshot(name)
    return {"k3s_version": k3s_version(name), "k3s_binary": str(binary), "k3s_sha256": sha256}


def server_spec(name: str, **overrides: Any) -> HostSpec:
    """A lab host that can run the k3s stand-in's server (the control plane binaries bound in)."""
    values: dict[str, Any] = {"extra_binds": [(BIN, KUBE_BIN_IN_HOST)], "extra_packages": LONGHORN_PACKAGES}
    values.update(overrides)
    return HostSpec(name, **values)


def worker_spec(name: str, **overrides: Any) -> HostSpec:
    values: dict[str, Any] = {"extra_packages": LONGHORN_PACKAGES}
    values.update(overrides)
    return HostSpec(name, **values)


def ensure_longhorn_manager(lab: Lab, server: Host) -> Path:
    """Start the Longhorn manager stand-in (lab/longhorn_standin/manager.py) for the cluster whose
    server is `server`, unless it runs already; its log file. It runs in the server host's network
    namespace (the API server at 127.0.0.1:6443, whatever the host's firewall lets in), waits for
    the kubeconfig k3s writes on the server and for Longhorn's CRDs, and reads each node's disk
    through the lab's hosts. Its command line names the lab's run directory, so the lab's teardown
    stops it with the hosts."""
    from lab.hosts.lab import LONGHORN_MANAGER_MODULE  # noqa: PLC0415
    from lab.hosts.processes import _pid_alive  # noqa: PLC0415

    state = lab.run_dir / "longhorn-manager"
    state.mkdir(exist_ok=True)
    pid_file, log_file = state / "manager.pid", state / "manager.log"
    if pid_file.exists() and _pid_alive(int(pid_file.read_text())):
        return log_file
    argv = ["ip", "netns", "exec", server.netns, str(REPO / "venv" / "bin" / "python"), "-m", LONGHORN_MANAGER_MODULE]
    argv += ["--kubeconfig", str(server.root / "etc" / "rancher" / "k3s" / "k3s.yaml")]
    argv += ["--lab-run-dir", str(lab.run_dir), "--state-dir", str(state)]
    with open(log_file, "ab") as out:
        process = subprocess.Popen(
            argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    pid_file.write_text(str(process.pid))
    return log_file


def stop_longhorn_manager(lab: Lab, timeout: float = 30) -> None:
    """Stop the Longhorn manager stand-in `ensure_longhorn_manager` started, if it runs: its
    cluster was torn down, and a new cluster on the same server gets a manager of its own."""
    from lab.hosts.processes import _pid_alive  # noqa: PLC0415

    pid_file = lab.run_dir / "longhorn-manager" / "manager.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    if _pid_alive(pid):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    pid_file.unlink()


def base_config(lab: Lab, server: Host, workers: Sequence[Host], **sections: Any) -> dict[str, Any]:
    """A stack config for existing lab hosts in public mode. A stack that installs Longhorn
    (`storage={"install_longhorn": True, ...}`) gets the lab's Longhorn manager stand-in beside it
    (`ensure_longhorn_manager`), as Longhorn's chart would start Longhorn's manager."""
    k3s_binary, k3s_sha256 = k3s_snapshot()
    config: dict[str, Any] = {
        "cluster": {
            "k3s_version": k3s_version(),
            "k3s_binary": str(k3s_binary),
            "k3s_sha256": k3s_sha256,
            "pod_network": "vxlan",  # the lab's kernel has no WireGuard module
            # The lab's "public" addresses are on its own bridge, not the internet: the one place
            # vxlan in public mode is acknowledged (the settings refuse it otherwise).
            "vxlan_over_public_addresses": "allowed",
            # Every lab's stack is named "lab": a port per lab keeps the API forwards of labs
            # that run side by side (the test run's workers) apart.
            "api_forward_port": 17000 + int(lab.lab_id[2:], 16) % 10000,
        },
        "server": {"name": server.name, "kind": "existing", "address": server.public_ip},
        # Lab hosts' keys are made fresh for each host; the runs (API, CLI, CI) are non-interactive.
        "ssh": {"private_key_file": str(lab.ssh_private_key_path), "trust_on_first_use": True},
        "network": {"mode": "public"},
        # Lab hosts run no firewall of their own: the stacks that leave it to the operator
        # acknowledge that (the join refuses such a node otherwise); `firewall={"managed": True}`
        # overrides only `managed`.
        "firewall": {"managed": False, "cloud_firewall": False, "none_acknowledged": True},
        # Longhorn's chart cannot be fetched here; the workers' disks are still probed at each join
        # (on a plain lab host that is this machine's disk under the host's overlay root).
        "storage": {"install_longhorn": False},
        "workers": [{"name": w.name, "kind": "existing", "address": w.public_ip} for w in workers],
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    if config["storage"].get("install_longhorn"):
        ensure_longhorn_manager(lab, server)
    return config


# The project's packages, compiled once per test process into the repository's __pycache__.
# Every program run and every dynamic-provider process of a lab stack imports the project from
# the stack's copy; where the environment sets PYTHONDONTWRITEBYTECODE (this CI machine does),
# no process writes a .pyc, so each one compiled every project module it imported from source:
# a seventh of a provider process's CPU, and a thousand such processes in a run. Python reads a
# .pyc whose recorded source mtime and size match the source, whatever its directory (the code's
# file name is set to the importing path at load), so the copy gets the repository's .pyc beside
# each file it copies (shutil.copy2 keeps the mtime). compileall writes even when the variable
# is set, and skips a file whose .pyc is current, so a second call costs a stat per file.
BYTECODE_PACKAGES = (
    "cluster_settings",
    "components",
    "host_scripts",
    "node_operations",
    "operator_api",
    "operator_cli",
    "providers",
    "remote_access",
)


@functools.cache
def ensure_repo_bytecode() -> None:
    """Compile the project's packages and `__main__.py` into the repository's __pycache__."""
    for package in BYTECODE_PACKAGES:
        if (REPO / package).is_dir():
            compileall.compile_dir(REPO / package, quiet=1)
    compileall.compile_file(REPO / "__main__.py", quiet=1)


def copy_bytecode(source: Path, copy: Path) -> None:
    """Put `source`'s current .pyc beside `copy` (a copy with the same mtime and size)."""
    if source.suffix != ".py":
        return
    compiled = Path(importlib.util.cache_from_source(str(source)))
    if compiled.is_file():
        target = Path(importlib.util.cache_from_source(str(copy)))
        target.parent.mkdir(exist_ok=True)
        shutil.copy2(compiled, target)


def link_lab_plugins(plugins: Path) -> None:
    """Make the lab's cached plugins (LAB_PLUGINS) installed plugins of the Pulumi home whose
    plugin folder is `plugins`: a real folder per plugin (the CLI skips a linked folder), its
    files linked to the cache."""
    if not LAB_PLUGINS.is_dir():
        return
    for cached in LAB_PLUGINS.iterdir():
        if not cached.is_dir() or cached.name.endswith((".partial", ".lock")):
            continue
        mirror = plugins / cached.name
        mirror.mkdir(parents=True, exist_ok=True)
        for item in cached.iterdir():
            link = mirror / item.name
            if not link.exists():
                link.symlink_to(item)


def lab_pulumi_env(state: Path) -> dict[str, str]:
    """The environment a lab stack's Pulumi CLI runs in: the lab's CLI first on PATH, a local
    file backend in `state`, the lab's passphrase, no plugin downloads (the lab's plugins are
    linked in, see `link_lab_plugins`), the project's venv python for the program."""
    return {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_CONFIG_PASSPHRASE": "hk3s-lab-passphrase",
        "PULUMI_BACKEND_URL": state.as_uri(),
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_PYTHON_CMD": str(REPO / "venv" / "bin" / "python"),
    }


@functools.cache
def _pulumi_command(root: str) -> auto.PulumiCommand:
    """The CLI under `root`, made once per process: making one runs `pulumi version` (to check it
    is new enough), and the harness made one for every operation of every stack. The binary under
    a root does not change while the tests run."""
    return auto.PulumiCommand(root=root)


@dataclass
class LabStack:
    """A copy of the project and one stack of it."""

    directory: Path
    name: str = "lab"
    log: list[str] = field(default_factory=list)
    netns: str | None = None
    """Run the CLI (and so the program and its providers) inside this network namespace,
    as an operator sitting on that network would."""

    def __post_init__(self) -> None:
        project = self.directory / "project"
        if not project.exists():
            listed = subprocess.run(
                ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            ensure_repo_bytecode()
            for name in listed:
                source = REPO / name
                if source.is_file() and not name.startswith(("lab/k3s_standin/", "lab/hcloud_provider/", "tests/")):
                    (project / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, project / name)
                    copy_bytecode(source, project / name)
            (project / "venv").symlink_to(REPO / "venv")
        (self.directory / "state").mkdir(exist_ok=True)
        link_lab_plugins(self.directory / "pulumi-home" / "plugins")
        self.project = project
        self.env = lab_pulumi_env(self.directory / "state")

    def write_config(self, config: dict[str, Any]) -> None:
        document = {"config": {f"hk3s:{key}": value for key, value in config.items()}}
        (self.project / f"Pulumi.{self.name}.yaml").write_text(yaml.safe_dump(document, sort_keys=False))

    def _cli_root(self) -> Path:
        if self.netns is None:
            return CACHE
        root = self.directory / "pulumi-in-netns"
        (root / "bin").mkdir(parents=True, exist_ok=True)
        wrapper = root / "bin" / "pulumi"
        wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {self.netns} {BIN / "pulumi"} "$@"\n')
        wrapper.chmod(0o755)
        return root

    def stack(self) -> auto.Stack:
        workspace = auto.LocalWorkspace(
            work_dir=str(self.project),
            pulumi_home=str(self.directory / "pulumi-home"),
            env_vars=self.env,
            pulumi_command=_pulumi_command(str(self._cli_root())),
        )
        return auto.Stack.create_or_select(self.name, workspace)

    def up(self, on_output: Callable[[str], None] | None = None) -> auto.UpResult:
        def record(line: str) -> None:
            self.log.append(line)
            if on_output is not None:
                on_output(line)

        # As scripts/stack.sh: more than the engine's default 8 operations at once.
        return self.stack().up(color="never", on_output=record, parallel=PARALLEL)

    def up_output(self) -> str:
        """`up` with a fresh log: the run's output and error when it failed, "" when it succeeded."""
        self.log.clear()
        try:
            self.up()
        except auto.CommandError as error:
            return f"{self.text()}\n{error}"
        return ""

    def preview(self, on_event: Callable[[auto.EngineEvent], None] | None = None) -> auto.PreviewResult:
        return self.stack().preview(color="never", on_output=self.log.append, on_event=on_event)

    def destroy(self) -> auto.DestroyResult:
        return self.stack().destroy(color="never", on_output=self.log.append, parallel=PARALLEL)

    def refresh(self, *args: str) -> auto.RefreshResult:
        return self.stack().refresh(color="never", on_output=self.log.append)

    def text(self) -> str:
        return "\n".join(self.log)

    def api(self) -> ClusterStack:
        """The operator API on this stack, as another service would make one."""
        return ClusterStack(
            self.name,
            project_dir=self.project,
            env_vars=self.env,
            pulumi_command_root=CACHE,
            pulumi_home=self.directory / "pulumi-home",
        )

    def hk3s(
        self,
        *args: str,
        timeout: float = 600,
        kill_when: str | None = None,
        on_line: Callable[[str], bool] | None = None,
    ) -> CliRun:
        """The operator CLI (`scripts/hk3s --stack <name> ARGS`) in the project copy, as a person
        runs it: stdin not a terminal, stderr apart; with `kill_when`, SIGKILLed at that line
        (`on_line`: see `run_killable`)."""
        env = {**os.environ, **self.env, "PULUMI_HOME": str(self.directory / "pulumi-home")}
        env.pop("HK3S_NON_INTERACTIVE", None)  # the CLI sets it itself
        argv = [str(self.project / "scripts" / "hk3s"), "--stack", self.name, *args]
        return run_killable(
            argv, cwd=self.project, env=env, timeout=timeout, split_stderr=True, kill_when=kill_when, on_line=on_line
        )


@dataclass(frozen=True)
class CliRun:
    """One command run: its exit status, its output (stderr on its own when asked for),
    and whether it was killed."""

    returncode: int
    output: str
    killed: bool
    stderr: str = ""

    @property
    def stdout(self) -> str:
        return self.output


def run_killable(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    kill_when: str | None = None,
    timeout: float = 900,
    split_stderr: bool = False,
    crash: bool = False,
    on_line: Callable[[str], bool] | None = None,
) -> CliRun:
    """Run `argv` in its own process group, stdin not a terminal; with `kill_when`, SIGKILL
    its process group as soon as a line containing that text appears (on stderr with
    `split_stderr`, else on the merged output). The Pulumi CLI starts each plugin (language
    host, provider processes) in a process group of its own (Pulumi's
    cmdutil.RegisterProcessGroup), so the kill reaches the CLI alone, as a `kill -9` of the CLI
    does; its provider processes then end by themselves (providers/engine_watch.py), their
    operations stopping where they were. `on_line` is called with each watched line as it
    arrives (a fault campaign injects its faults there); its True kills the run as `kill_when`
    does. With `crash`, every process the run started is
    SIGKILLed at once, as when the machine running it goes down."""
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if split_stderr else subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a kill reaches the provider processes too
    )
    assert process.stdout is not None
    out: list[str] = []
    watched = process.stdout
    if split_stderr:
        assert process.stderr is not None
        stdout = process.stdout
        threading.Thread(target=lambda: out.extend(stdout), daemon=True).start()
        watched = process.stderr
    lines: list[str] = []
    killed = False
    deadline = time.monotonic() + timeout
    doomed: list[int] = []
    for line in watched:
        lines.append(line)
        if (kill_when is not None and kill_when in line) or (on_line is not None and on_line(line)):
            doomed = _descendants(process.pid) if crash else []
            os.killpg(process.pid, signal.SIGKILL)
            for pid in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed = True
            break
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError(f"{' '.join(argv)} ran past {timeout:.0f}s:\n{''.join(lines[-50:])}")
    process.wait()
    if killed:
        # Wait until nothing of the killed run is left.
        for _ in range(100):
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                if not any(Path(f"/proc/{pid}").exists() for pid in doomed):
                    break
            time.sleep(0.1)
    if split_stderr:
        time.sleep(0.2)  # the reader thread drains what stdout still holds
        return CliRun(process.returncode, "".join(out), killed, "".join(lines))
    return CliRun(process.returncode, "".join(lines), killed)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces; the parent is the second field after it.
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_cli(
    stack: LabStack,
    args: Sequence[str],
    *,
    kill_when: str | None = None,
    timeout: float = 900,
    crash: bool = False,
    on_line: Callable[[str], bool] | None = None,
) -> CliRun:
    """Run `pulumi <args> --stack <name>` in the project copy (see `run_killable`)."""
    env = {**os.environ, **stack.env, "PULUMI_HOME": str(stack.directory / "pulumi-home")}
    argv = ["pulumi", *args, "--stack", stack.name, "--non-interactive", "--color", "never"]
    return run_killable(
        argv, cwd=stack.project, env=env, kill_when=kill_when, timeout=timeout, crash=crash, on_line=on_line
    )
