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


def program_lines(run: str) -> list[str]:
    """The lines of a step's script that run the program."""
    return [line.strip() for line in run.splitlines() if line.strip().startswith("scripts/hk3s")]


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
    assert len(preview) == 1 and program_lines(preview[0]) == [
        'scripts/hk3s --stack ${{ matrix.environment }} --json preview > "$RUNNER_TEMP/plan.json"'
    ]
    assert '>> "$GITHUB_STEP_SUMMARY"' in preview[0]
    assert workflow()["defaults"]["run"]["shell"] == "bash"  # -eo pipefail: a failed preview fails the step
    up = [command for command in runs() if "scripts/hk3s" in command]
    assert len(up) == 1 and program_lines(up[0])[-1] == "scripts/hk3s --stack ${{ matrix.environment }} up --yes"
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
                assert "scripts/hk3s" in step.get("run", ""), step
    # No token, key or passphrase written out; the Hetzner token is a Pulumi config secret.
    assert "HCLOUD_TOKEN" not in text and "BEGIN OPENSSH" not in text
    assert not re.search(r"PULUMI_CONFIG_PASSPHRASE:\s*['\"]?[^$\s{]", text)


def test_the_lab_tests_run_the_same_commands() -> None:
    lab = LAB_TESTS.read_text()
    # tests/lab/test_automation.py runs `scripts/hk3s --stack <name> ARGS`: preview, and up --yes.
    assert 'argv = [str(self.stack.project / "scripts" / "hk3s"), "--stack", self.stack.name, *args]' in lab
    assert 'cluster.hk3s("up", "--yes")' in lab
    assert 'cluster.hk3s("--json", "preview")' in lab, "the lab tests run the JSON preview the workflow keeps"
    commands = [line for name in ("plan", "deploy") for command in runs(name) for line in program_lines(command)]
    assert len(commands) == 3
    for command in commands:
        assert re.fullmatch(
            r'scripts/hk3s --stack \$\{\{ matrix\.environment \}\} (--json preview > "\$RUNNER_TEMP/\w+\.json"|up --yes)',
            command,
        ), command


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
        # The plan job's role reads only (test_the_plan_job_reads_the_state_only).
        role = "HK3S_STATE_READ_ROLE_ARN" if name == "plan" else "HK3S_STATE_ROLE_ARN"
        assert settings["role-to-assume"] == f"${{{{ vars.{role} }}}}"
        assert "aws-access-key-id" not in settings and "aws-secret-access-key" not in settings
        assert int(settings["role-duration-seconds"]) <= 3600


def step_named(job_name: str, prefix: str) -> dict[str, Any]:
    return next(step for step in job(job_name)["steps"] if step.get("name", "").startswith(prefix))


def test_the_plan_job_reads_the_state_only() -> None:
    """The plan job needs no reviewer, so it can do nothing the approval should guard: its state
    role is another, read-only one (a preview takes no lock and writes nothing: Pulumi's DIY
    backend previews without `Lock`), and no step but the preview's holds the deploy key."""
    plan, deploy = job("plan"), job("deploy")
    read_role = step_named("plan", "State backend credentials")["with"]["role-to-assume"]
    write_role = step_named("deploy", "State backend credentials")["with"]["role-to-assume"]
    assert read_role == "${{ vars.HK3S_STATE_READ_ROLE_ARN }}" and write_role == "${{ vars.HK3S_STATE_ROLE_ARN }}"
    assert (
        "HK3S_STATE_READ_ROLE_ARN (one that admits the `<env>-plan` environment, allowed s3:ListBucket"
        in (WORKFLOW.read_text())
        and "and GetObject only)" in WORKFLOW.read_text()
    )
    for name in ("plan", "deploy"):
        holding = [step for step in job(name)["steps"] if "DEPLOY_KEY" in (step.get("env") or {})]
        assert len(holding) == 1 and "scripts/hk3s" in holding[0]["run"], name
    assert plan["environment"] != deploy["environment"]


def test_the_deploy_key_is_gone_when_the_step_that_used_it_ends() -> None:
    """Written in the step that runs the program and removed on that step's exit (a trap: also
    when the program fails), so no later step, a third-party action included, can read it."""
    for name in ("plan", "deploy"):
        run = next(step["run"] for step in job(name)["steps"] if "DEPLOY_KEY" in (step.get("env") or {}))
        lines = [line.strip() for line in run.splitlines()]
        trap = lines.index("trap 'rm -f ~/.ssh/id_ed25519 ~/.ssh/id_ed25519.pub' EXIT")
        written = next(i for i, line in enumerate(lines) if '"$DEPLOY_KEY" > ~/.ssh/id_ed25519' in line)
        assert trap < written, "the trap is set before the key exists"
        assert "umask 077" in lines[written], "the key is never readable by others, even for a moment"
        later = [step for step in job(name)["steps"] if step.get("run") != run]
        assert all("id_ed25519" not in str(step) for step in later)


def test_the_deploy_applies_only_the_reviewed_plan() -> None:
    """The plan job keeps its preview as the run's artifact; the deploy, after the approval,
    previews again and applies only when the plan is the one the reviewer read."""
    upload = step_named("plan", "Keep the plan")
    assert upload["uses"].startswith("actions/upload-artifact@")
    assert upload["with"]["name"] == "plan-${{ matrix.environment }}"
    assert upload["with"]["path"] == "${{ runner.temp }}/plan.json"
    download = step_named("deploy", "The reviewed plan")
    assert download["uses"].startswith("actions/download-artifact@")
    assert download["with"] == {"name": "plan-${{ matrix.environment }}", "path": "${{ runner.temp }}/reviewed"}
    up = next(command for command in runs() if "scripts/hk3s" in command)
    lines = [line.strip() for line in up.splitlines()]
    check = 'python3 examples/ci/reviewed_plan.py check "$RUNNER_TEMP/reviewed/plan.json" "$RUNNER_TEMP/now.json"'
    assert lines.index(check) == len(lines) - 2 and lines[-1].endswith(" up --yes")
    assert lines[lines.index(check) - 1].endswith('--json preview > "$RUNNER_TEMP/now.json"')


def test_reviewed_plan_refuses_a_plan_that_differs() -> None:
    """examples/ci/reviewed_plan.py on real `scripts/hk3s --json preview` documents (its shape:
    operator_cli.cli.preview_data): the same changes in another order pass, a change added,
    dropped or of another kind is refused, naming it."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from operator_api.events import PlannedChange  # noqa: PLC0415
    from operator_api.runs import Preview  # noqa: PLC0415
    from operator_cli.cli import preview_data  # noqa: PLC0415

    def document(*ops: tuple[str, str]) -> str:
        steps = [
            PlannedChange(f"urn:pulumi:dev::hk3s::hk3s:index:X::{name}", "hk3s:index:X", name, op) for op, name in ops
        ]
        return json.dumps(preview_data(Preview(steps=steps, summary={})))

    reviewed = document(("update", "w1-firewall"), ("create", "w2-join"))
    script = REPO / "examples" / "ci" / "reviewed_plan.py"
    cases = {
        document(("create", "w2-join"), ("update", "w1-firewall")): (0, ""),
        document(("update", "w1-firewall"), ("create", "w2-join"), ("delete", "w3-join")): (1, "not reviewed: delete"),
        document(("update", "w1-firewall")): (1, "reviewed but no longer planned: create"),
        document(("replace", "w1-firewall"), ("create", "w2-join")): (1, "not reviewed: replace"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "reviewed.json"
        before.write_text(reviewed)
        for now_text, (code, said) in cases.items():
            now = Path(tmp) / "now.json"
            now.write_text(now_text)
            result = subprocess.run(
                [sys.executable, str(script), "check", str(before), str(now)],
                capture_output=True,
                text=True,
                check=False,
            )
            assert result.returncode == code, result.stderr
            assert said in result.stderr
            if code:
                assert "nothing was applied" in result.stderr
        summary = subprocess.run(
            [sys.executable, str(script), "summary", str(before)], capture_output=True, text=True, check=True
        ).stdout
        assert "| update | `urn:pulumi:dev::hk3s::hk3s:index:X::w1-firewall` |" in summary


def test_dependencies_install_with_hashes_before_any_secret() -> None:
    """Both jobs that hold secrets install from requirements.lock with pip's --require-hashes
    (scripts/setup_python.sh passes it for a file with hashes), before any secret is in reach;
    the lock pins every package requirements.txt names at the same version, each with a hash."""
    for name in ("plan", "deploy"):
        steps = job(name)["steps"]
        install = [i for i, step in enumerate(steps) if step.get("run") == "scripts/setup_python.sh requirements.lock"]
        secret = [i for i, step in enumerate(steps) if "secrets." in str(step.get("env") or {})]
        assert len(install) == 1 and install[0] < min(secret), name
    setup = (REPO / "scripts" / "setup_python.sh").read_text()
    assert "hashes=(--require-hashes --no-deps)" in setup and "grep -q -- '--hash=' " in setup
    lock = (REPO / "requirements.lock").read_text()
    entries = re.findall(r"^([a-z0-9-]+)==(\S+) \\\n    --hash=sha256:[0-9a-f]{64}$", lock, re.MULTILINE)
    pins = {
        re.sub(r"[-_.]+", "-", name).lower(): version
        for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (REPO / "requirements.txt").read_text(), re.M)
    }
    locked = dict(entries)
    body = "".join(line for line in lock.splitlines(keepends=True) if not line.startswith("#"))
    assert len(locked) == len(entries) == body.count("--hash=sha256:")
    assert {name: locked.get(name) for name in pins} == pins
