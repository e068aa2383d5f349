"""The example CI workflow (examples/ci/github-actions-deploy.yml): pull requests get a job
with no secret at all; main gets a plan job per environment (the preview, in the run's
summary) and then a deploy job in a protected environment, one run per environment at a time,
no secret values, each secret only in the step that needs it, actions pinned by commit, the
Pulumi CLI by version and checksum, and exactly the commands the lab tests run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "examples" / "ci" / "github-actions-deploy.yml"
LAB_TESTS = REPO / "tests" / "lab" / "test_automation.py"


def workflow() -> dict[str, Any]:
    data = YAML(typ="safe").load(WORKFLOW.read_text())  # YAML 1.2: `on` stays a string key
    assert isinstance(data, dict)
    return data


def job(name: str = "deploy") -> dict[str, Any]:
    jobs = workflow()["jobs"]
    assert sorted(jobs) == ["check", "deploy", "plan"], "a secret-free check for pull requests, plan, deploy"
    return dict(jobs[name])


def runs(name: str = "deploy") -> list[str]:
    return [step["run"] for step in job(name)["steps"] if "run" in step]


def test_pull_requests_run_without_any_secret_and_main_deploys_in_a_protected_environment() -> None:
    triggers = workflow()["on"]
    assert "pull_request" in triggers and triggers["push"]["branches"] == ["main"]
    check, deploy = job("check"), job("deploy")
    assert check["if"] == "github.event_name == 'pull_request'"
    # The pull request's own code runs here: no secret, no backend, no deploy key, no environment.
    assert "secrets." not in repr(check) and "environment" not in check and "env" not in check
    plan = job("plan")
    assert plan["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert plan["environment"] == "${{ matrix.environment }}-plan"
    # The up waits for every plan, and a reviewer approves it with the plan in the run's summary.
    assert deploy["needs"] == "plan" and deploy["environment"] == "${{ matrix.environment }}"
    preview = [command for command in runs("plan") if "scripts/hk3s" in command]
    assert len(preview) == 1 and preview[0].startswith(
        'scripts/hk3s --stack ${{ matrix.environment }} preview | tee "$RUNNER_TEMP/preview.txt"\n'
    )
    assert '>> "$GITHUB_STEP_SUMMARY"' in preview[0]
    assert workflow()["defaults"]["run"]["shell"] == "bash"  # -eo pipefail: a failed preview fails the step
    assert [command for command in runs() if "scripts/hk3s" in command] == [
        "scripts/hk3s --stack ${{ matrix.environment }} up --yes"
    ]
    for name in ("check", "plan", "deploy"):
        checkout = next(step for step in job(name)["steps"] if step.get("uses", "").startswith("actions/checkout"))
        assert checkout["with"]["persist-credentials"] is False


def test_one_job_per_environment_each_with_its_stack_file() -> None:
    environments = job()["strategy"]["matrix"]["environment"]
    assert environments == ["dev", "staging"] == job("plan")["strategy"]["matrix"]["environment"]
    for env in environments:
        assert (REPO / f"Pulumi.{env}.yaml").is_file(), env


def test_one_run_per_environment_at_a_time_never_cancelled() -> None:
    concurrency = job()["concurrency"]
    assert "${{ matrix.environment }}" in concurrency["group"]
    assert concurrency["cancel-in-progress"] is False  # a killed up leaves the stack locked


def test_no_secret_value_in_the_workflow_and_each_secret_only_where_it_is_needed() -> None:
    text = WORKFLOW.read_text()
    needs = {
        "PULUMI_CONFIG_PASSPHRASE": "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}",
        "PULUMI_BACKEND_URL": "${{ secrets.PULUMI_BACKEND_URL }}",
    }
    for name in ("plan", "deploy"):
        assert "env" not in job(name), "no secret for the whole job"
        for step in job(name)["steps"]:
            env = step.get("env") or {}
            for key, value in env.items():
                assert key == "PULUMI_VERSION" or re.fullmatch(r"\$\{\{ secrets\.[A-Z0-9_]+ \}\}", value), (key, value)
            if "scripts/hk3s" in step.get("run", ""):
                assert {key: env[key] for key in needs} == needs
            else:
                assert not set(env) & set(needs), step
            if any("secrets." in str(value) for value in env.values()):
                assert "scripts/hk3s" in step.get("run", "") or set(env) == {"DEPLOY_KEY"}, step
    # No token, key or passphrase written out; the Hetzner token is a Pulumi config secret.
    assert "HCLOUD_TOKEN" not in text and "BEGIN OPENSSH" not in text
    assert not re.search(r"PULUMI_CONFIG_PASSPHRASE:\s*['\"]?[^$\s{]", text)


def test_the_lab_tests_run_the_same_commands() -> None:
    lab = LAB_TESTS.read_text()
    # tests/lab/test_automation.py runs `scripts/hk3s --stack <name> ARGS`: preview, and up --yes.
    assert 'argv = [str(self.stack.project / "scripts" / "hk3s"), "--stack", self.stack.name, *args]' in lab
    assert 'cluster.hk3s("preview")' in lab and 'cluster.hk3s("up", "--yes")' in lab
    for command in [command for command in runs() if command.startswith("scripts/hk3s")]:
        assert re.fullmatch(r"scripts/hk3s --stack \$\{\{ matrix\.environment \}\} (preview|up --yes)", command)


def test_actions_are_pinned_by_commit_and_the_cli_by_version_and_checksum() -> None:
    """A tag can be moved to another commit; a commit cannot. The Pulumi CLI's archive is
    checked against its release's checksums file (pulumi-<version>-checksums.txt)."""
    for name in ("check", "plan", "deploy"):
        for step in job(name)["steps"]:
            if "uses" in step:
                assert re.fullmatch(r"[a-z-]+/[a-z-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
    text = WORKFLOW.read_text()
    assert re.findall(r"# v\d+\.\d+\.\d+", text), "each pin names its version in a comment"
    for name in ("plan", "deploy"):
        install = next(step for step in job(name)["steps"] if step.get("name") == "Install the Pulumi CLI")
        assert re.fullmatch(r"3\.\d+\.\d+", install["env"]["PULUMI_VERSION"])
        assert 'sha256sum --check --ignore-missing "pulumi-${PULUMI_VERSION}-checksums.txt"' in install["run"]
    # The version the lab tests run (lab/build/pulumi.sh builds it).
    lab_version = re.search(r'PULUMI_VERSION="v([0-9.]+)"', (REPO / "lab" / "build" / "pulumi.sh").read_text())
    assert lab_version and install["env"]["PULUMI_VERSION"] == lab_version.group(1)


def test_the_state_bucket_is_reached_with_short_lived_oidc_credentials_only() -> None:
    """The S3 backend's credentials come from GitHub's OIDC token exchanged for a role's session
    (aws-actions/configure-aws-credentials with role-to-assume), right before the step that runs
    the program: no long-lived AWS key is stored as a secret, the pull request's job cannot ask for
    a token, and the steps before (checkout, install, the deploy key) run without the session."""
    text = WORKFLOW.read_text()
    assert "AWS_ACCESS_KEY_ID" not in text and "AWS_SECRET_ACCESS_KEY" not in text
    assert workflow()["permissions"] == {"contents": "read"}  # no OIDC token by default
    assert "permissions" not in job("check")
    for name in ("plan", "deploy"):
        assert job(name)["permissions"] == {"contents": "read", "id-token": "write"}
        steps = job(name)["steps"]
        oidc = [
            i
            for i, step in enumerate(steps)
            if step.get("uses", "").startswith("aws-actions/configure-aws-credentials@")
        ]
        program = [i for i, step in enumerate(steps) if "scripts/hk3s" in step.get("run", "")]
        assert len(oidc) == 1 and program == [oidc[0] + 1], "the session is made right before the program's step"
        settings = steps[oidc[0]]["with"]
        assert settings["role-to-assume"] == "${{ vars.HK3S_STATE_ROLE_ARN }}"
        assert "aws-access-key-id" not in settings and "aws-secret-access-key" not in settings
        assert int(settings["role-duration-seconds"]) <= 3600
