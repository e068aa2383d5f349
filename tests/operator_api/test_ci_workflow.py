"""The example CI workflow (examples/ci/github-actions-deploy.yml): pull requests get a job
with no secret at all; main gets one deploy job per environment (preview, then up) in a
protected environment, one run per environment at a time, no secret values, and exactly the
commands the lab tests run."""

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
    assert sorted(jobs) == ["check", "deploy"], "a secret-free check for pull requests, one deploy job"
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
    assert deploy["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert deploy["environment"] == "${{ matrix.environment }}"
    assert [command for command in runs() if command.startswith("scripts/hk3s")] == [
        "scripts/hk3s --stack ${{ matrix.environment }} preview",
        "scripts/hk3s --stack ${{ matrix.environment }} up --yes",
    ]
    for name in ("check", "deploy"):
        checkout = next(step for step in job(name)["steps"] if step.get("uses", "").startswith("actions/checkout"))
        assert checkout["with"]["persist-credentials"] is False


def test_one_job_per_environment_each_with_its_stack_file() -> None:
    environments = job()["strategy"]["matrix"]["environment"]
    assert environments == ["dev", "staging"]
    for env in environments:
        assert (REPO / f"Pulumi.{env}.yaml").is_file(), env


def test_one_run_per_environment_at_a_time_never_cancelled() -> None:
    concurrency = job()["concurrency"]
    assert "${{ matrix.environment }}" in concurrency["group"]
    assert concurrency["cancel-in-progress"] is False  # a killed up leaves the stack locked


def test_no_secret_value_in_the_workflow() -> None:
    text = WORKFLOW.read_text()
    env = job()["env"]
    assert env["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"
    assert env["PULUMI_BACKEND_URL"] == "${{ secrets.PULUMI_BACKEND_URL }}"
    for step in job()["steps"]:
        for name, value in (step.get("env") or {}).items():
            assert re.fullmatch(r"\$\{\{ secrets\.[A-Z0-9_]+ \}\}", value), (name, value)
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
