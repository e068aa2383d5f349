"""Which backend and secrets provider a stack uses (operator_api.state_backend,
operator_api.workspace.resolve_backend), read without an engine: PULUMI_BACKEND_URL when set,
the local default only for a user who never ran `pulumi login` (and the first run says so), the
secrets provider the stack file names, the passphrase asked for only when the stack uses it. The
backend a logged-in user's `pulumi whoami` reports is read through the real Pulumi CLI in
tests/lab/test_automation.py and tests/lab/test_s3_state.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from operator_api import ClusterStack, StackError
from operator_api.stack_file import StackDocument
from operator_api.state_backend import secrets_provider_problem, secrets_provider_to_use
from operator_cli.cli import main

KMS = "awskms://1234abcd-12ab-34cd-56ef-1234567890ab?region=eu-central-1"


@pytest.fixture
def never_logged_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user with a HOME of their own, no PULUMI_BACKEND_URL and no `pulumi login` (no credentials file)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.delenv("PULUMI_HOME", raising=False)
    monkeypatch.delenv("CI", raising=False)
    return home


def test_pulumi_backend_url_wins(project: Path, backend: Path, never_logged_in: Path) -> None:
    credentials = never_logged_in / ".pulumi" / "credentials.json"
    credentials.parent.mkdir()
    credentials.write_text(json.dumps({"current": "s3://elsewhere?region=r"}))
    api = ClusterStack("dev", project_dir=project, env_vars={"PULUMI_BACKEND_URL": backend.as_uri()})
    assert (api.backend_url, api.backend_choice.source) == (backend.as_uri(), "PULUMI_BACKEND_URL")


def test_a_user_who_never_logged_in_gets_the_local_default_and_the_first_run_says_where(
    project: Path, never_logged_in: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = ClusterStack("dev", project_dir=project)
    default = (never_logged_in / ".hk3s-state").as_uri()
    assert (api.backend_url, api.backend_choice.source) == (default, "default")
    assert api.backend_choice.first_use
    notice = api.backend_choice.notice()
    assert default in notice and "pulumi login" in notice and "PULUMI_BACKEND_URL" in notice, notice
    # The CLI says it on stderr before anything else (here the refusal of a missing passphrase).
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    main(["--project-dir", str(project), "--stack", "dev", "status"], stdin=io.StringIO(""))
    err = capsys.readouterr().err
    assert err.startswith(f"hk3s: {notice}"), err
    # Once the stack's state is there, it is not said again.
    (never_logged_in / ".hk3s-state" / ".pulumi").mkdir(parents=True)
    assert not ClusterStack("dev", project_dir=project).backend_choice.first_use


def test_the_secrets_provider_is_the_one_the_stack_file_names() -> None:
    assert StackDocument(f"secretsprovider: {KMS}\nencryptedkey: abc\nconfig: {{}}\n").secrets_provider == KMS
    assert StackDocument("encryptionsalt: v1:abc\nconfig: {}\n").secrets_provider == "passphrase"
    assert StackDocument("config: {}\n").secrets_provider is None
    # The file's provider wins over a choice (the stack exists with it); a new stack takes the
    # choice; the passphrase is the default of a DIY backend, a service keeps its own.
    assert secrets_provider_to_use("file:///s", KMS, "passphrase") == KMS
    assert secrets_provider_to_use("s3://b?region=r", None, KMS) == KMS
    assert secrets_provider_to_use("file:///s", None, None) == "passphrase"
    assert secrets_provider_to_use("https://api.pulumi.com", None, None) is None


def test_a_key_service_stack_is_not_refused_for_want_of_a_passphrase(
    project: Path, backend: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stack whose file names a key service opens without PULUMI_CONFIG_PASSPHRASE: what stops
    this engine-less run is the missing Pulumi CLI, not the passphrase. A passphrase stack still
    asks for it, naming the key-service alternative."""
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    stack_file = project / "Pulumi.dev.yaml"
    passphrase_stack = ClusterStack("dev", project_dir=project, env_vars={"PULUMI_BACKEND_URL": backend.as_uri()})
    with pytest.raises(StackError, match="PULUMI_CONFIG_PASSPHRASE is not set") as refused:
        passphrase_stack.preview()
    assert "--secrets-provider" in str(refused.value)
    stack_file.write_text(f"secretsprovider: {KMS}\nencryptedkey: abc\n{stack_file.read_text()}")
    kms_stack = ClusterStack("dev", project_dir=project, env_vars={"PULUMI_BACKEND_URL": backend.as_uri()})
    assert kms_stack.secrets_provider_in_use() == KMS
    with pytest.raises(StackError) as stopped:
        kms_stack.preview()
    assert "PASSPHRASE" not in str(stopped.value) and "Pulumi CLI is not installed" in str(stopped.value)


def test_a_secrets_provider_pulumi_does_not_know_is_refused_by_name(project: Path, backend: Path) -> None:
    with pytest.raises(StackError) as refused:
        ClusterStack("dev", project_dir=project, secrets_provider="vault://key")
    assert "vault://key" in str(refused.value) and "awskms://" in str(refused.value)


def test_a_project_that_names_its_backend_in_pulumi_yaml_uses_it(
    project: Path, backend: Path, never_logged_in: Path
) -> None:
    """As the Pulumi CLI: after PULUMI_BACKEND_URL, the project's `backend.url`, before any login."""
    pulumi_yaml = project / "Pulumi.yaml"
    pulumi_yaml.write_text(pulumi_yaml.read_text() + f"backend:\n  url: {backend.as_uri()}\n")
    api = ClusterStack("dev", project_dir=project)
    assert (api.backend_url, api.backend_choice.source) == (backend.as_uri(), "Pulumi.yaml")
    assert not api.backend_choice.first_use


@pytest.mark.parametrize(
    ("output", "named"),
    [
        # aws-sdk-go-v2 aws/credential_cache.go and credentials/ec2rolecreds, as gocloud's awskms keeper reports them.
        (
            "error: get credentials: failed to refresh cached credentials, no EC2 IMDS role found, operation error "
            "ec2imds: GetMetadata, access disabled to EC2 IMDS via client option",
            "has no credentials",
        ),
        (
            "operation error KMS: Decrypt, https response error StatusCode: 400, NotFoundException: Key does not exist",
            "names a key",
        ),
        ("operation error KMS: Encrypt, StatusCode: 400, AccessDeniedException: not allowed", "refused the key's use"),
    ],
)
def test_a_key_services_failure_is_one_line_naming_the_fix(output: str, named: str) -> None:
    problem = secrets_provider_problem(output, KMS)
    assert problem is not None and named in problem and KMS in problem and "\n" not in problem, problem
    # Another failure of a run is left to the run's own report; a passphrase stack's too.
    assert secrets_provider_problem("error: resource failed", KMS) is None
    assert secrets_provider_problem(output, "passphrase") is None
