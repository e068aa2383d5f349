"""`ClusterStack`: one environment's stack of this program, driven through `pulumi.automation`.

Each change to the cluster is an edit of the stack file `Pulumi.<env>.yaml` followed by
`up`, exactly what an operator does by hand, so the file stays the single source of truth
that `pulumi preview`, CI and this API share.

What happens to the stack file:

* bad input (`SettingsRejectedError`): never written;
* the stack is busy (`StackBusyError`): never written (or put back, when another run
  took the lock in the instant between the check and the run);
* the program refused (`RefusedError`: capability missing, preflight, settings only a machine
  can check): put back byte for byte, and one more `up` returns the stack (other resources
  the refused run already moved, and the stack outputs) to it;
* a resource failed part-way (`ResourceFailedError`) or the run was interrupted: kept, so the
  next `up()` continues towards it.

Before every run that takes the stack's lock, an interrupted earlier run is cleaned up
(docs/recovery.md): a lock file of a file backend left by a process
that no longer runs on this host is removed (a live one, or one from another host, makes
the stack busy and is never touched), and pending operations are resolved with
`refresh --clear-pending-creates`; the program's resources adopt what exists, so the run
then continues where the interrupted one stopped.

Where the state is kept, and what is done with the backend itself (which backend and secrets
provider the stack uses, its checks, locks and kept states), is operator_api.state_backend's:
`ClusterStack` makes the runs and the changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pulumi import automation as auto

from cluster_settings import SettingProblem
from node_operations.health import check_hosts as check_hosts_of
from node_operations.reboot import (
    DRAIN_TIMEOUT_SECONDS,
    READY_TIMEOUT_SECONDS,
    RebootReport,
)
from node_operations.workload_start import WorkloadRef
from remote_access.ssh import SshTarget

from .cluster_access import (
    api_forward_during,
    check_probed_disk,
    check_rebootable,
    held_running_now,
    live_status,
    reboot,
    start_workload,
    with_live_states,
)
from .deployment import LONGHORN_ROLE_TYPE, Deployment
from .errors import (
    LockHolder,
    RefusedError,
    SettingsRejectedError,
    StackBusyError,
    StackError,
    TeardownNotConfirmedError,
    shown,
)
from .events import EventCallback, RunRecord
from .hetzner_power import fenced_hetzner_server, power_on_fenced
from .locks import UnlockReport, lock_age
from .nodes import ClusterStatus, DiskCheck, DownWorker, HostCheck, LastRun, Node
from .runs import Preview, Recovery, RunResult, holders_from_message, keys_recorded_on_first_use
from .stack_file import StackDocument, StackFile, check_stack_name
from .state_backend import (
    PASSPHRASE,
    Checkpoint,
    StateBackend,
    check_secrets_provider_url,
    secrets_provider_problem,
    secrets_provider_to_use,
)
from .workspace import check_passphrase, pulumi_command, pulumi_environment, resolve_backend, run_temporary_directory

REPO = Path(__file__).resolve().parents[1]
__all__ = ["REPO", "ClusterStack", "Preview", "Recovery", "RunResult"]
OutputCallback = Callable[[str], None]
_OUTPUT_TAIL = 400
DISK_PROBE_TYPE = "pulumi-python:dynamic/hk3s:DiskProbe"


class ClusterStack:
    """The stack of one environment (`Pulumi.<env>.yaml`) of this project.

    `project_dir` is this repository by default (a copy works too, as the lab tests use).
    `env_vars` add to the environment of every Pulumi command. The backend is the one the user's
    Pulumi CLI uses, as in scripts/stack.sh: `PULUMI_BACKEND_URL` when set, else the one `pulumi
    login` chose, else (never logged in) `file://$HOME/.hk3s-state` (`backend_choice` says which).
    A new stack is made with `secrets_provider` (a key service's URL, `awskms://...`), by default
    the passphrase for a file:// or s3:// backend and the service's own for Pulumi Cloud; an
    existing one is opened with the provider its stack file names, and `PULUMI_CONFIG_PASSPHRASE`
    (or `_FILE`) is needed only when that is the passphrase. `pulumi_command_root` picks a Pulumi
    CLI (`<root>/bin/pulumi`); without it the one on PATH is used.
    """

    def __init__(
        self,
        env: str = "dev",
        *,
        project_dir: Path | str = REPO,
        env_vars: Mapping[str, str] | None = None,
        pulumi_command_root: Path | str | None = None,
        pulumi_home: Path | str | None = None,
        parallel: int = 32,
        secrets_provider: str | None = None,
    ) -> None:
        check_stack_name(env)
        self.env = env
        if secrets_provider is not None:
            check_secrets_provider_url(secrets_provider)
        self.secrets_provider = secrets_provider
        self.project_dir = Path(project_dir).resolve()
        self.parallel = parallel
        self.pulumi_home = str(pulumi_home) if pulumi_home is not None else None
        self.file = StackFile(self.project_dir / f"Pulumi.{env}.yaml")
        self.env_vars = pulumi_environment(self.project_dir, dict(env_vars or {}), pulumi_command_root)
        self.project = str(yaml.safe_load((self.project_dir / "Pulumi.yaml").read_text())["name"])
        self._command_root = str(pulumi_command_root) if pulumi_command_root is not None else None
        # The backend the user's Pulumi CLI uses (PULUMI_BACKEND_URL, else its login, else the
        # local default), named to every command so that all of them see the same stack.
        self.backend_choice = resolve_backend(
            {**self.env_vars, **({"PULUMI_HOME": self.pulumi_home} if self.pulumi_home else {})},
            self.project_dir,
            lambda: pulumi_command(self._command_root, self.env_vars["PATH"]),
        )
        self.backend_url = self.env_vars["PULUMI_BACKEND_URL"] = self.backend_choice.url
        self._workspace: auto.LocalWorkspace | None = None
        # The stack selected for the change `_exclusive` holds: selecting it is a `pulumi stack
        # select` each time, and one change selected it three or four times.
        self._held_stack: auto.Stack | None = None
        # Which backend, its checks, locks and kept states (operator_api.state_backend).
        self.backend = StateBackend(self.backend_url, self.env_vars, self.project, env)

    # --- setup ---------------------------------------------------------------------------
    def _stack(self) -> auto.Stack:
        """Select the stack, creating it on first use (with `secrets_provider_in_use()`)."""
        return self._workspace_stack(create=True)

    def _existing_stack(self) -> auto.Stack | None:
        """Select the stack if it exists; reading never creates it (which would write an
        encryption salt into the stack file)."""
        try:
            return self._workspace_stack(create=False)
        except auto.StackNotFoundError:
            return None

    def secrets_provider_in_use(self) -> str | None:
        """The secrets provider the stack is opened (or will be made) with: the one its stack file
        names, else the one given to this object, else the passphrase for a file:// or s3:// backend
        (operator_api.state_backend.secrets_provider_to_use); None: the service backend's own."""
        named = self.file.document().secrets_provider if self.file.exists() else None
        return secrets_provider_to_use(self.backend_url, named, self.secrets_provider)

    def _outputs(self, stack: auto.Stack) -> auto.OutputMap:
        """The stack's outputs (decrypted by its secrets provider: a key service's failure is one line)."""
        try:
            return stack.outputs()
        except auto.CommandError as error:
            problem = secrets_provider_problem(str(error), self.secrets_provider_in_use())
            if problem is None:
                raise
            raise StackError(problem) from None

    def _workspace_stack(self, *, create: bool) -> auto.Stack:
        if self._held_stack is not None:
            return self._held_stack
        if not self.file.exists():
            raise StackError(
                f"{self.file.path.name} does not exist: copy Pulumi.dev.yaml to it and edit it (docs/configuration.md)"
            )
        provider = self.secrets_provider_in_use()
        if provider == PASSPHRASE:
            # Asked for only when the stack uses it: a key service's stack opens without it.
            check_passphrase(self.env_vars, self.env)
        self.backend.check()
        if self._workspace is None:
            self._workspace = auto.LocalWorkspace(
                work_dir=str(self.project_dir),
                pulumi_home=self.pulumi_home,
                env_vars=self.env_vars,
                secrets_provider=provider,
                pulumi_command=pulumi_command(self._command_root, self.env_vars["PATH"]),
            )
            # The one mapping every command starts with: a run's own $TMPDIR goes in here (_run).
            self._workspace.env_vars = self.env_vars
        try:
            if create:
                return auto.Stack.create_or_select(self.env, self._workspace)
            return auto.Stack.select(self.env, self._workspace)
        except auto.CommandError as error:
            problem = secrets_provider_problem(str(error), provider)
            if problem is None:
                raise
            raise StackError(problem) from None

    def init(self) -> str | None:
        """Make the stack in its backend (`pulumi stack init`) with the secrets provider chosen for
        this object (`secrets_provider=`), else the default (see `secrets_provider_in_use`); a stack
        that exists is left as it is, and one made with another provider than the one chosen is
        refused, naming the command that changes it. Returns the provider the stack uses."""
        self._stack()
        in_use = self.secrets_provider_in_use()
        if self.secrets_provider is not None and in_use != self.secrets_provider:
            raise StackError(
                f"stack {self.env} exists with secrets provider {shown(str(in_use))}, "
                f"not {shown(self.secrets_provider)}: to move it, "
                f"`pulumi stack change-secrets-provider URL --stack {self.env}` (docs/ci.md)"
            )
        return in_use

    def unlock(self, *, confirm: bool = False, only: Sequence[LockHolder] | None = None) -> UnlockReport:
        """The stack's Pulumi locks, each holder and age; with `confirm`, removed. For the run
        that died holding the stack on another machine (a CI runner): its lock is never taken
        away silently. A lock held by a process that still runs on this machine is refused; one
        from another machine is removed on your word that its run is dead, so check first.
        The next change (`up()` and the rest) then clears the interrupted run's pending
        operations and continues. With `only`, just those of the given holders still there
        (the ones an operator was shown) are considered."""
        with self.backend.operator_lock().hold("unlock"):
            holders, states = self.backend.holders()
            if only is not None:
                shown = {holder.path for holder in only}
                kept = [(h, st) for h, st in zip(holders, states, strict=True) if h.path in shown]
                holders, states = [h for h, _ in kept], [st for _, st in kept]
            live = [holder for holder, state in zip(holders, states, strict=True) if state == "live"]
            if confirm and live:
                raise StackBusyError(self.env, live, "that process still runs on this machine; it is not removed")
            removed = self.backend.remove(holders) if confirm else []
            return UnlockReport(self.env, holders, [lock_age(holder.since) for holder in holders], removed)

    def checkpoints(self) -> list[Checkpoint]:
        """The states the backend kept after each run of this stack, newest first
        (operator_api.state_backend)."""
        return self.backend.checkpoints()

    def export_state(self) -> dict[str, Any]:
        """The stack's state as `pulumi stack export` writes it, every secret encrypted (never
        `--show-secrets`: the export may be kept or handed on)."""
        if self._existing_stack() is None:
            raise StackError(f"stack {self.env} has no state yet")
        assert self._workspace is not None
        env = {**self.env_vars, **({"PULUMI_HOME": self.pulumi_home} if self.pulumi_home else {})}
        command = pulumi_command(self._command_root, self.env_vars["PATH"])
        result = command.run(["stack", "export", "--stack", self.env], str(self.project_dir), env)
        exported = json.loads(result.stdout)
        return {"version": exported["version"], "deployment": exported["deployment"]}

    def restore(self, checkpoint: Checkpoint, *, confirm: str) -> None:
        """Make `checkpoint` (one of `checkpoints()`) the stack's state again, as `pulumi stack
        import` does: after a bad run, the state before it, with every secret in it (the pinned
        host keys, the login key and the previous one) as it was. `confirm` must be the stack's
        name. Changes no host: the next `preview` shows what differs from the hosts."""
        if confirm != self.env:
            raise StackError(
                f"restoring stack {self.env} to the state of {checkpoint.taken} replaces its state: "
                f"pass confirm={self.env!r} to say you mean it"
            )
        with self._exclusive(f"restoring the state of {checkpoint.taken}", None, clear_pending=False):
            self._stack().import_stack(self.backend.checkpoint_state(checkpoint))

    def _backend_lock(self, action: str) -> contextlib.AbstractContextManager[None]:
        """The stack's lock in its backend for an operation that makes no Pulumi run itself
        (StateBackend.hold). Taken inside `_exclusive`, which has removed a stale lock of this
        machine and refused a live one already."""
        return self.backend.hold(action)

    # --- reading -----------------------------------------------------------------------
    def settings_document(self) -> StackDocument:
        """The stack file as it is now."""
        return self.file.document()

    def nodes(self, *, live: bool = True) -> list[Node]:
        """Every node the last `up` recorded in the stack's `nodes` output (empty before the first),
        each node's `state` and `k3s_version` read from the cluster now (through the server,
        read-only): `Ready`, `NotReady`, `OutOfService` (fenced: never Ready), with `,cordoned`, or
        `missing`; the recorded state stays in `recorded_state`. When the server cannot be asked,
        the nodes keep their recorded states (a fenced worker's reads `OutOfService`) and
        `live_error` says why. `live=False`: the recorded states only, without asking the cluster."""
        stack = self._existing_stack()
        outputs = self._outputs(stack) if stack is not None else {}
        value = outputs["nodes"].value if "nodes" in outputs else []
        nodes = [Node.from_output(item) for item in value or []]
        if not live or stack is None or not nodes:
            return nodes
        try:
            settings = self.settings_document().validate("reading the nodes")
            return with_live_states(nodes, settings, self._host_targets(Deployment.export(stack)))
        except (StackError, OSError) as error:
            # The recorded nodes still answer when the stack file or the SSH key cannot be read.
            return [dataclasses.replace(node, live_error=str(error)) for node in nodes]

    def kubeconfig(self) -> str | None:
        """The cluster's kubeconfig (a Pulumi secret: keep it out of logs)."""
        stack = self._existing_stack()
        outputs = self._outputs(stack) if stack is not None else {}
        return str(outputs["kubeconfig"].value) if "kubeconfig" in outputs else None

    def status(self, *, check_hosts: bool = False) -> ClusterStatus:
        """Endpoint, version, nodes, the last run, pending operations and current lock holders.
        Each node's state is read from the cluster now (as `nodes()`), and each worker NotReady
        and not fenced is listed with the workloads stranded on it, the nodes holding a current
        copy of their data, and the command that fences it (`down_workers`); a server that does
        not answer leaves the recorded states (`live_error`). Carries no secret. With
        `check_hosts`, also read-only checks of every node over SSH (k3s running, disk space, the
        clock, the client certificate's expiry); a node that cannot be reached is named in
        `warnings`, not fatal."""
        stack = self._existing_stack()
        outputs = self._outputs(stack) if stack is not None else {}

        def output(key: str) -> Any:
            return outputs[key].value if key in outputs and not outputs[key].secret else None

        info = stack.info(show_secrets=False) if stack is not None else None
        last = None
        if info is not None:
            last = LastRun(
                kind=str(info.kind),
                result=str(info.result),
                started=info.start_time.isoformat(),
                ended=info.end_time.isoformat() if info.end_time else None,
                resource_changes={str(k): int(v) for k, v in (info.resource_changes or {}).items()},
            )
        holders, states = self.backend.holders()
        # One export of the state serves the pending operations and the hosts to ask or check.
        deployment = Deployment.export(stack) if stack is not None else None
        nodes = [Node.from_output(item) for item in output("nodes") or []]
        down: list[DownWorker] = []
        live_error = None
        held_running: list[str] = []
        if nodes and deployment is not None:
            try:
                settings = self.settings_document().validate("reading the cluster's state")
                nodes, down, live_error = live_status(nodes, settings, self._host_targets(deployment))
                if live_error is None:
                    held_running = held_running_now(settings, self._host_targets(deployment), self.env)
            except (StackError, OSError) as error:
                # Status still says what the stack records when the file or key cannot be read.
                live_error = str(error)
                nodes = [dataclasses.replace(node, live_error=live_error) for node in nodes]
        targets = self._host_targets(deployment) if check_hosts and deployment else []
        health = asyncio.run(check_hosts_of(targets, deployment.longhorn_server())) if targets and deployment else []
        return ClusterStatus(
            stack=self.env,
            api_endpoint=output("api_endpoint"),
            k3s_version=output("k3s_version"),
            storage_classes=list(output("storage_classes") or []),
            nodes=nodes,
            last_run=last,
            pending_operations=deployment.pending_operations() if deployment is not None else [],
            locked_by=[f"{holder} ({state})" for holder, state in zip(holders, states, strict=True)],
            host_checks=[HostCheck.from_health(item) for item in health],
            warnings=[warning for item in health for warning in item.warnings],
            down_workers=down,
            live_error=live_error,
            held_running=held_running,
        )

    def _host_targets(self, deployment: Deployment) -> list[SshTarget]:
        """Each recorded node's SSH target, logging in with the stack's hk3s:ssh settings."""
        settings = self.settings_document().validate("checking the hosts")
        private_key = settings.ssh.private_key_file.expanduser().read_text()
        return deployment.host_targets(private_key, settings.ssh.user)

    def pending_operations(self, stack: auto.Stack | None = None) -> list[str]:
        """`<op> <urn>` for each operation an interrupted run started and never saw finish."""
        return Deployment.export(stack or self._stack()).pending_operations()

    # --- runs ---------------------------------------------------------------------------
    def preview(
        self,
        *,
        proposed: StackDocument | None = None,
        on_event: EventCallback | None = None,
        on_output: OutputCallback | None = None,
    ) -> Preview:
        """What `up` would change, per resource. With `proposed`, for that config instead of
        the stack file's (the file is not touched)."""
        stack = self._stack()
        record = RunRecord()
        with self._proposed_file(proposed) as config_file:
            self._run(
                "preview",
                record,
                on_output,
                lambda output: stack.preview(
                    color="never",
                    on_output=output,
                    on_error=output,
                    on_event=self._events(record, on_event),
                    config_file=config_file,
                    parallel=self.parallel,
                ),
            )
        return Preview(steps=list(record.steps.values()), summary=record.summary)

    def up(self, *, on_event: EventCallback | None = None, on_output: OutputCallback | None = None) -> RunResult:
        """Bring the cluster to the stack file, recovering from an interrupted run first."""
        with self._exclusive("up", on_output) as recovery:
            return self._up(recovery, on_event, on_output)

    def refresh(self, *, on_event: EventCallback | None = None, on_output: OutputCallback | None = None) -> RunResult:
        """Read every resource back from its host and record drift in the state."""
        with self._exclusive("refresh", on_output) as recovery, self._api_forward(self._stack(), on_output):
            return self._engine_run("refresh", recovery, on_event, on_output)

    def destroy_stack(
        self, *, confirm: str, on_event: EventCallback | None = None, on_output: OutputCallback | None = None
    ) -> RunResult:
        """Tear the stack down (`pulumi destroy`): k3s and every volume's data wiped from every
        host, the stack's Hetzner resources deleted, no copy moved. `confirm` must be the
        stack's name. Refused before anything changes unless the stack's hk3s:cluster.teardown
        is `allowed` and an `up` applied it (providers.teardown_guard)."""
        if confirm != self.env:
            raise TeardownNotConfirmedError(
                f"destroying stack {self.env} needs confirm={self.env!r} (got {confirm!r}); nothing was changed"
            )
        # An interrupted destroy is finished by the next one: its pending deletes run again, and
        # a refresh first would read hosts the destroy already wiped.
        with (
            self._exclusive("destroy", on_output, clear_pending=False) as recovery,
            self._api_forward(self._stack(), on_output),
        ):
            return self._engine_run("destroy", recovery, on_event, on_output)

    # --- changes ------------------------------------------------------------------------
    def add_worker(
        self,
        name: str,
        *,
        kind: Literal["existing", "hetzner"] = "existing",
        address: str | None = None,
        ssh_port: int = 22,
        ssh_address: str | None = None,
        private_address: str | None = None,
        holds_copies: bool = True,
        labels: Mapping[str, str] | None = None,
        server_type: str | None = None,
        location: str | None = None,
        on_event: EventCallback | None = None,
        on_output: OutputCallback | None = None,
    ) -> RunResult:
        """Add a worker to `hk3s:workers` and join it (`up`)."""
        entry: dict[str, Any] = {"name": name, "kind": kind}
        optional = {
            "address": address,
            "ssh_address": ssh_address,
            "private_address": private_address,
            "server_type": server_type,
            "location": location,
        }
        entry.update({key: value for key, value in optional.items() if value is not None})
        if ssh_port != 22:
            entry["ssh_port"] = ssh_port
        if not holds_copies:
            entry["holds_copies"] = False
        if labels:
            entry["labels"] = dict(labels)
        return self.change(
            f"adding worker {name}", lambda doc: doc.add_worker(entry), on_event=on_event, on_output=on_output
        )

    def remove_worker(
        self,
        name: str,
        *,
        force: bool = False,
        on_event: EventCallback | None = None,
        on_output: OutputCallback | None = None,
    ) -> RunResult:
        """Drop a worker from `hk3s:workers` (and its fence) and run `up`; with `force`, give up a
        fenced worker (deregistered without a drain, its fence entry kept with force_remove)."""
        return self.change(
            f"{'giving up' if force else 'removing'} worker {name}",
            lambda doc: doc.remove_worker(name, force=force),
            on_event=on_event,
            on_output=on_output,
        )

    def fence(
        self,
        name: str,
        *,
        powered_off: bool = False,
        accept_stale_data: bool = False,
        on_event: EventCallback | None = None,
        on_output: OutputCallback | None = None,
    ) -> RunResult:
        """Record `hk3s:fences.<name>` and run `up`."""
        return self.change(
            f"fencing {name}",
            lambda doc: doc.set_fence(name, powered_off=powered_off, accept_stale_data=accept_stale_data),
            on_event=on_event,
            on_output=on_output,
        )

    def unfence(
        self, name: str, *, on_event: EventCallback | None = None, on_output: OutputCallback | None = None
    ) -> RunResult:
        """Lift `hk3s:fences.<name>` and run `up`; a Hetzner worker is powered on first (hetzner_power)."""
        settings = self.settings_document().validate(f"unfencing {name}")
        if fenced_hetzner_server(settings, self.env, name) is not None:
            powering = f"powering on {name}"
            with self._exclusive(powering, on_output, clear_pending=False), self._backend_lock(powering):
                config = (stack := self._stack()).get_all_config()
                power_on_fenced(
                    settings,
                    name,
                    stack=self.env,
                    targets=self._host_targets(Deployment.export(stack)),
                    config=lambda key: config[key].value if key in config else None,
                    env=self.env_vars,
                    say=lambda line: _say(on_output, line),
                )
        return self.change(
            f"unfencing {name}", lambda doc: doc.remove_fence(name), on_event=on_event, on_output=on_output
        )

    def propose(self, edit: Callable[[StackDocument], None], action: str = "the change") -> StackDocument:
        """The stack file with `edit` applied and validated, not written (for a preview)."""
        if not self.file.exists():
            raise StackError(
                f"{self.file.path.name} does not exist: copy Pulumi.dev.yaml to it and edit it"
                " (docs/getting-started-hetzner.md)"
            )
        document = self.file.document()
        edit(document)
        document.validate(action)
        return document

    def change(
        self,
        action: str,
        edit: Callable[[StackDocument], None],
        *,
        on_event: EventCallback | None = None,
        on_output: OutputCallback | None = None,
    ) -> RunResult:
        """Edit the stack file, validate the whole config, write it and run `up` (see the module
        docstring for what happens to the file when the run does not succeed)."""
        self.propose(edit, action)  # bad input fails here, before any lock, stack or file is touched
        with self._exclusive(action, on_output) as recovery:
            before = self.file.read_bytes()  # after stack creation, which may add an encryption salt
            document = self.propose(edit, action)  # again under the lock: the file may have moved on
            self.file.write_document(document)
            try:
                return self._up(recovery, on_event, on_output)
            except RefusedError as error:
                self.file.write_bytes(before)
                error.config_restored = True
                # The refused run may have moved other resources and the stack outputs already
                # (the outputs are written even by a failed run): return them to the restored file.
                _say(on_output, "the change was refused; the stack file is put back and the stack returned to it")
                try:
                    self._up(Recovery(), None, on_output)
                    error.stack_restored = True
                except StackError as restore_error:
                    error.restore_error = restore_error
                raise error from None
            except StackBusyError:
                self.file.write_bytes(before)
                raise

    def reboot_worker(
        self,
        name: str,
        *,
        drain_timeout: float = DRAIN_TIMEOUT_SECONDS,
        ready_timeout: float = READY_TIMEOUT_SECONDS,
        on_output: OutputCallback | None = None,
    ) -> RebootReport:
        """Reboot one worker: cordon, drain, reboot, wait for Ready, uncordon, then wait until the
        workloads that were ready before are ready again (node_operations.reboot). Refused for a
        fenced worker (in the stack file or recorded on its Node), a NotReady one, and while another
        node is down or cordoned (a worker whose fence finished is not down); a resume checks the
        other nodes again. The stack is held against other operations meanwhile; no Pulumi run is made."""
        action = f"rebooting {name}"
        settings = self.settings_document().validate(action)
        check_rebootable(settings, name, action)
        with self._exclusive(action, on_output, clear_pending=False), self._backend_lock(action):
            targets = self._host_targets(Deployment.export(self._stack()))
            return reboot(
                settings,
                targets,
                name,
                drain_timeout=drain_timeout,
                ready_timeout=ready_timeout,
                say=lambda line: _say(on_output, line),
            )

    def start_workload(
        self, workload: str, *, accept_stale_data: bool = False, on_output: OutputCallback | None = None
    ) -> str:
        """Start one workload a fence stopped, `workload` as NAMESPACE/KIND/NAME (Deployment,
        StatefulSet, ReplicaSet, Job or CronJob), judged as the fence judges: with a current copy of
        every volume on a node Ready and not fenced, or, with `accept_stale_data`, copies that may
        be older. Refused otherwise (`WorkloadStartRefusedError`, naming each volume and the fix),
        changing nothing. Returns the report's line. The stack is held meanwhile; no Pulumi run."""
        action = f"starting {workload}"
        try:
            ref = WorkloadRef.parse(workload)
        except ValueError as error:
            raise SettingsRejectedError([SettingProblem("workload", str(error))], action=action) from None
        settings = self.settings_document().validate(action)
        with self._exclusive(action, on_output, clear_pending=False), self._backend_lock(action):
            targets = self._host_targets(Deployment.export(self._stack()))
            return start_workload(
                settings, targets, ref, accept_stale_data=accept_stale_data, say=lambda line: _say(on_output, line)
            )

    def check_disk(
        self, name: str, *, on_event: EventCallback | None = None, on_output: OutputCallback | None = None
    ) -> DiskCheck:
        """Probe one worker's Longhorn disk again and return the verdict (also in `nodes()` after).

        An `up` that replaces that worker's `DiskProbe` and targets it, its `LonghornNodeRole` (the
        verdict on its Longhorn node) and the stack's root (whose `nodes` output carries the verdict):
        nothing else is read or changed, and the stack file is not touched."""
        action = f"checking the disk of {name}"
        settings = self.settings_document().validate(action)
        check_probed_disk(settings, name, action)
        with self._exclusive(action, on_output) as recovery:
            deployment = Deployment.export(self._stack())
            urn = deployment.resource_urn(DISK_PROBE_TYPE, f"{name}-disk")
            if urn is None:
                raise StackError(
                    f"{name}'s disk has not been probed yet: it is probed at the end of its join; run up first"
                )
            role = deployment.resource_urn(LONGHORN_ROLE_TYPE, f"{name}-longhorn-role")
            target = [urn, deployment.stack_urn(), *([role] if role else [])]
            self._engine_run("up", recovery, on_event, on_output, replace=[urn], target=target)
            outputs = Deployment.export(self._stack()).resource_outputs(urn)
        return DiskCheck.from_output(outputs)

    # --- internals ----------------------------------------------------------------------
    def _up(self, recovery: Recovery, on_event: EventCallback | None, on_output: OutputCallback | None) -> RunResult:
        return self._engine_run("up", recovery, on_event, on_output)

    def _engine_run(
        self,
        kind: Literal["up", "refresh", "destroy"],
        recovery: Recovery,
        on_event: EventCallback | None,
        on_output: OutputCallback | None,
        *,
        replace: list[str] | None = None,
        target: list[str] | None = None,
    ) -> RunResult:
        """`up`, `refresh` or `destroy`; `replace` and `target` narrow an `up` to the resources they name."""
        stack = self._stack()
        record = RunRecord()

        def run(output: OutputCallback) -> object:
            events = self._events(record, on_event)
            if kind == "refresh":
                return stack.refresh(
                    color="never", on_output=output, on_error=output, on_event=events, parallel=self.parallel
                )
            if kind == "destroy":
                return stack.destroy(
                    color="never", on_output=output, on_error=output, on_event=events, parallel=self.parallel
                )
            return stack.up(
                color="never",
                on_output=output,
                on_error=output,
                on_event=events,
                parallel=self.parallel,
                replace=replace,
                target=target,
            )

        self._run(kind, record, on_output, run)
        return RunResult(kind, record.summary, record.changes, recovery, keys_recorded_on_first_use(record))

    @staticmethod
    def _events(record: RunRecord, on_event: EventCallback | None) -> EventCallback:
        def handle(event: auto.events.EngineEvent) -> None:
            record.handle(event)
            if on_event is not None:
                on_event(event)

        return handle

    def _run(
        self,
        command: str,
        record: RunRecord,
        on_output: OutputCallback | None,
        call: Callable[[OutputCallback], object],
    ) -> None:
        tail: deque[str] = deque(maxlen=_OUTPUT_TAIL)

        def output(line: str) -> None:
            tail.append(line)
            if on_output is not None:
                on_output(line)

        try:
            # Every engine run gets a temporary directory of its own, removed when it ends (the
            # Kubernetes provider leaves a copy of the admin kubeconfig in it). The workspace
            # starts its commands with this same mapping (_workspace_stack).
            with run_temporary_directory(self.env_vars):
                call(output)
        except auto.ConcurrentUpdateError as error:
            raise StackBusyError(self.env, holders_from_message(str(error)), "held by a Pulumi run") from None
        except auto.CommandError as error:
            text = "\n".join(tail) or str(error)
            problem = secrets_provider_problem(f"{text}\n{error}", self.secrets_provider_in_use())
            if problem is not None:
                raise StackError(problem) from None
            raise record.to_error(command, text) from None

    @contextlib.contextmanager
    def _proposed_file(self, proposed: StackDocument | None) -> Iterator[str | None]:
        if proposed is None:
            yield None
            return
        handle, path = tempfile.mkstemp(prefix=f".Pulumi.{self.env}.proposed.", suffix=".yaml", dir=self.project_dir)
        try:
            with os.fdopen(handle, "w") as out:
                out.write(proposed.render())
            yield path
        finally:
            Path(path).unlink(missing_ok=True)

    @contextlib.contextmanager
    def _exclusive(
        self, action: str, on_output: OutputCallback | None, *, clear_pending: bool = True
    ) -> Iterator[Recovery]:
        """Hold the stack for one change; clean up after an interrupted run first."""
        self.backend.s3()  # checked before anything is touched
        with self.backend.operator_lock().hold(action):
            stale = self.backend.take_over(lambda line: _say(on_output, line))
            self._held_stack = self._stack()
            try:
                yield self._recover(self._held_stack, stale, clear_pending, on_output)
            finally:
                self._held_stack = None

    @contextlib.contextmanager
    def _api_forward(self, stack: auto.Stack, on_output: OutputCallback | None) -> Iterator[None]:
        """The forward to the Kubernetes API for a run that does not start the program (which
        opens it itself): a refresh or a destroy (remote_access.api_forward). A stack file the
        run will refuse anyway, or one without Longhorn, opens none (and exports no state)."""
        settings, targets = None, list[SshTarget]()
        with contextlib.suppress(SettingsRejectedError):
            settings = self.settings_document().validate("opening the Kubernetes API")
        if settings is not None and settings.storage.install_longhorn:
            deployment = Deployment.export(stack)
            targets = self._host_targets(deployment) if deployment.resources else []
        with api_forward_during(settings, targets, self.project, self.env, lambda line: _say(on_output, line)):
            yield

    def _recover(
        self, stack: auto.Stack, stale: list[LockHolder], clear_pending: bool, on_output: OutputCallback | None
    ) -> Recovery:
        """Clear what an interrupted run left: its pending operations (a refresh)."""
        pending = self.pending_operations(stack) if clear_pending else []
        if pending:
            _say(on_output, f"clearing {len(pending)} pending operation(s) of an interrupted run (refresh)")
            record = RunRecord()
            with self._api_forward(stack, on_output):
                self._run(
                    "refresh",
                    record,
                    on_output,
                    lambda output: stack.refresh(
                        color="never",
                        on_output=output,
                        on_error=output,
                        clear_pending_creates=True,
                        parallel=self.parallel,
                    ),
                )
        return Recovery(stale_locks=stale, cleared_pending=pending)


def _say(on_output: OutputCallback | None, message: str) -> None:
    if on_output is not None:
        on_output(f"hk3s: {message}")
