"""The README's main command reaches `pulumi preview` with the real Pulumi CLI
(built by lab/build/pulumi.sh) on a local state backend with a passphrase.

The stack uses existing hosts only, so no Hetzner plugin is needed (this
machine cannot download plugins); the addresses are documentation addresses
nothing answers on, which also shows that preview logs in to no host."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.provider_shards import shard_of
from lab.kms_server import running_kms_server
from lab.stack_harness import BIN, skip_without_lab_binaries

REPO = Path(__file__).resolve().parents[2]
CACHE_BIN = BIN

pytestmark = pytest.mark.lab

STACK = """\
config:
  hk3s:cluster:
    k3s_version: v1.37.2+k3s1
    pod_network: vxlan
  hk3s:server:
    name: srv
    kind: existing
    address: 192.0.2.200
  hk3s:ssh:
    private_key_file: {key}
  hk3s:storage:
    install_longhorn: false
  hk3s:workers:
    - name: w1
      kind: existing
      address: 192.0.2.201
    - name: w2
      kind: existing
      address: 192.0.2.202
      holds_copies: false
"""


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    skip_without_lab_binaries("pulumi")
    copy = tmp_path / "project"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    (copy / "venv").symlink_to(REPO / "venv")
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (copy / "Pulumi.local.yaml").write_text(STACK.format(key=key))
    return copy


def first_run_block(page: Path) -> list[str]:
    """The command lines of `page`'s first-run block: its first ```bash block that runs
    `scripts/stack.sh preview`, comments and blank lines dropped."""
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.DOTALL):
        lines = [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
        if any("scripts/stack.sh preview" in line for line in lines):
            return lines
    raise AssertionError(f"{page.name} has no first-run block")


# Terminal control sequences (CSI, and OSC ended by BEL or ST) and carriage returns.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\r")


def test_readme_command_reaches_preview(project_copy: Path, tmp_path: Path) -> None:
    """The README's first-run block, typed line by line in one shell at a terminal, as a newcomer
    types it: every line runs with what the lines before it set (the passphrase that encrypts the
    stack's secrets, the token). docs/getting-started-hetzner.md's block starts with the same
    lines. The stack `dev` is here one of existing hosts at documentation addresses nothing answers
    on (this machine has no Hetzner plugin), so the preview logs in to no host; the block's `up`
    would need the machines and is left out, and the block's next `scripts/hk3s --stack dev` line
    (`node list`) runs in the same shell after the preview."""
    readme = first_run_block(REPO / "README.md")
    assert first_run_block(REPO / "docs" / "getting-started-hetzner.md")[: len(readme)] == readme
    up = "scripts/hk3s --stack dev up"
    assert up in readme and any(line.startswith("scripts/hk3s --stack dev node list") for line in readme), readme
    (project_copy / "Pulumi.dev.yaml").write_text((project_copy / "Pulumi.local.yaml").read_text())
    typed = project_copy / "typed.sh"
    typed.write_text("set -e\n" + "".join(f"{line}\n" for line in readme if line != up))
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{CACHE_BIN}:{os.environ['PATH']}",
        "PULUMI_HOME": str(tmp_path / ".pulumi"),
    }
    # Only what the block itself sets.
    for name in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE", "HCLOUD_TOKEN"):
        env.pop(name, None)
    # At a terminal: `script` gives the shell a pseudo-terminal (a run with none is unattended and
    # refuses the unpinned hosts' first contact).
    completed = subprocess.run(
        ["script", "--quiet", "--return", "--command", "bash typed.sh", "/dev/null"],
        cwd=project_copy,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = ANSI.sub("", completed.stdout + completed.stderr)
    assert "PULUMI_CONFIG_PASSPHRASE is not set" not in output, output[-3000:]
    assert completed.returncode == 0, output[-5000:]
    for line in ("hk3s:index:ClusterServer", "hk3s:index:WorkerNode", "hk3s:HostProbe", "hk3s:NodeJoin"):
        assert line in output, line
    # Stack, 5 components, and per node a probe and a host firewall; the server's k3s;
    # per worker a join and two connection checks (mode auto: they run if the network plan
    # decides private); a disk probe for w1 (w2 holds no copies); the network plan; the worker
    # roster and the run's one check of the recorded nodes; the run's k3s upgrade of the workers
    # (K3sUpgrade: it acts only when the version changes); per node its login key and the
    # retirement of replaced keys; the teardown guard; the two barriers (every firewall in place,
    # every login-key holder done: components/barrier.py). Plus one provider process per shard the
    # three nodes fall in.
    shards = len({shard_of(name) for name in ("srv", "w1", "w2")})
    assert f"{33 + shards} to create" in output, output[-2000:]
    for barrier in ("firewalls-in-place", "login-key-holders"):
        assert f"hk3s:order:Barrier {barrier} create" in output, barrier
    assert "hk3s:WorkerRoster" in output and "hk3s:NodeAccessCheck" in output and "hk3s:K3sUpgrade" in output
    assert "hk3s:TeardownGuard" in output
    assert "hk3s:ConnectivityCheck" in output and "hk3s:NetworkPlan" in output
    # The local backend the README names holds the stack.
    assert list((tmp_path / ".hk3s-state").rglob("dev.json*")), "no stack state in ~/.hk3s-state"
    assert "BEGIN OPENSSH PRIVATE KEY" not in output


def test_bad_config_fails_preview_naming_the_key(project_copy: Path, tmp_path: Path) -> None:
    stack = project_copy / "Pulumi.local.yaml"
    stack.write_text(stack.read_text().replace("name: w2", "name: W_2"))
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{CACHE_BIN}:{os.environ['PATH']}",
        "PULUMI_CONFIG_PASSPHRASE": "lab-passphrase",
        "PULUMI_HOME": str(tmp_path / ".pulumi"),
    }
    completed = subprocess.run(
        ["bash", "scripts/stack.sh", "preview", "--stack", "local", "--non-interactive"],
        cwd=project_copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0
    assert "hk3s:workers[1].name: 'W_2' is not a DNS-1123 node name" in output, output[-3000:]


def test_k3s_below_the_floor_fails_preview_naming_the_setting(project_copy: Path, tmp_path: Path) -> None:
    # v1.29: the join permit's ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) is beta
    # and off there, so every join would fail on the host; preview refuses it first.
    stack = project_copy / "Pulumi.local.yaml"
    stack.write_text(stack.read_text().replace("k3s_version: v1.37.2+k3s1", "k3s_version: v1.29.15+k3s1"))
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{CACHE_BIN}:{os.environ['PATH']}",
        "PULUMI_CONFIG_PASSPHRASE": "lab-passphrase",
        "PULUMI_HOME": str(tmp_path / ".pulumi"),
    }
    completed = subprocess.run(
        ["bash", "scripts/stack.sh", "preview", "--stack", "local", "--non-interactive"],
        cwd=project_copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0
    assert "hk3s:cluster.k3s_version: v1.29.15+k3s1 is older than v1.30.0" in output, output[-3000:]
    assert "ValidatingAdmissionPolicy" in output and "Traceback" not in output, output[-3000:]


def _run(argv: list[str], project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)


def _unattended(project: Path) -> None:
    """The stack as a run with no terminal takes it: the documentation hosts' keys trusted on first use."""
    stack = project / "Pulumi.local.yaml"
    stack.write_text(stack.read_text().replace("  hk3s:ssh:\n", "  hk3s:ssh:\n    trust_on_first_use: true\n"))


def _own_env(tmp_path: Path) -> dict[str, str]:
    """A user of this machine with a HOME and a Pulumi home of their own and no backend set."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PULUMI_", "AWS_"))}
    env |= {
        "HOME": str(tmp_path),
        "PATH": f"{CACHE_BIN}:{os.environ['PATH']}",
        "PULUMI_HOME": str(tmp_path / ".pulumi"),
    }
    return env


def test_a_pulumi_login_is_where_stack_sh_and_hk3s_keep_the_stack(project_copy: Path, tmp_path: Path) -> None:
    """A user who ran `pulumi login file://DIR`, PULUMI_BACKEND_URL unset: `scripts/stack.sh
    preview` makes the stack there, and `scripts/hk3s` finds it there (`init` says where and
    why); no ~/.hk3s-state is made and the first-run line about it is not said."""
    _unattended(project_copy)
    env = _own_env(tmp_path) | {"PULUMI_CONFIG_PASSPHRASE": "lab-passphrase"}
    team_state = tmp_path / "team-state"
    team_state.mkdir()
    login = _run(["pulumi", "login", team_state.as_uri()], project_copy, env)
    assert login.returncode == 0, login.stderr
    preview = _run(["bash", "scripts/stack.sh", "preview", "--stack", "local", "--non-interactive"], project_copy, env)
    assert preview.returncode == 0, (preview.stdout + preview.stderr)[-3000:]
    assert f"Creating stack local in {team_state.as_uri()}" in preview.stderr, preview.stderr[-3000:]
    assert list(team_state.rglob("local.json*")), "the stack is not in the login's backend"
    found = _run(["scripts/hk3s", "--stack", "local", "--json", "init"], project_copy, env)
    assert found.returncode == 0, found.stderr[-3000:]
    assert json.loads(found.stdout) == {
        "stack": "local",
        "backend": team_state.as_uri(),
        "secrets_provider": "passphrase",
    }, found.stdout
    assert "no Pulumi login" not in preview.stderr + found.stderr
    assert not (tmp_path / ".hk3s-state").exists(), "a second, empty state was made"


def test_a_key_service_stack_runs_with_no_passphrase(project_copy: Path, tmp_path: Path) -> None:
    """A stack made by `scripts/hk3s init --secrets-provider awskms://...` (AWS KMS's API served by
    moto in the lab): its stack file names the key and holds no passphrase salt, `scripts/stack.sh
    preview` and `scripts/hk3s status` run with no PULUMI_CONFIG_PASSPHRASE, and without
    credentials for the key service the run stops with one line naming the fix."""
    _unattended(project_copy)
    with running_kms_server(tmp_path) as kms:
        url = kms.secrets_provider(kms.create_key())
        env = _own_env(tmp_path) | {"PULUMI_BACKEND_URL": (tmp_path / "state").as_uri(), **kms.credentials()}
        made = _run(["scripts/hk3s", "--stack", "local", "init", "--secrets-provider", url], project_copy, env)
        assert made.returncode == 0 and url in made.stdout, made.stderr[-3000:]
        document = yaml.safe_load((project_copy / "Pulumi.local.yaml").read_text())
        assert document["secretsprovider"] == url and document.get("encryptedkey"), list(document)
        assert "encryptionsalt" not in document, "a passphrase salt in a key service's stack"
        # Asked again for another provider: refused, naming the command that moves it.
        other = _run(
            ["scripts/hk3s", "--stack", "local", "init", "--secrets-provider", "passphrase"], project_copy, env
        )
        assert other.returncode != 0 and "change-secrets-provider" in other.stderr, other.stderr[-3000:]
        secret = _run(
            ["pulumi", "config", "set", "--secret", "hcloud:token", "kept-by-the-key", "--stack", "local"],
            project_copy,
            env,
        )
        assert secret.returncode == 0, secret.stderr
        assert "kept-by-the-key" not in (project_copy / "Pulumi.local.yaml").read_text()
        # The state names the key service, and holds no passphrase salt.
        state = [p for p in (tmp_path / "state").rglob("local.json") if p.parent.name == "hk3s" and "stacks" in p.parts]
        assert len(state) == 1, state
        providers = json.loads(state[0].read_text())["checkpoint"]["latest"]["secrets_providers"]
        assert providers["type"] == "cloud" and providers["state"]["url"] == url, providers
        assert "salt" not in json.dumps(providers), providers
        preview = _run(
            ["bash", "scripts/stack.sh", "preview", "--stack", "local", "--non-interactive"], project_copy, env
        )
        assert preview.returncode == 0, (preview.stdout + preview.stderr)[-3000:]
        status = _run(["scripts/hk3s", "--stack", "local", "status"], project_copy, env)
        assert status.returncode == 0, status.stderr[-3000:]
        assert "PULUMI_CONFIG_PASSPHRASE" not in preview.stderr + status.stderr
        bare = {key: value for key, value in env.items() if not key.startswith("AWS_")}
        bare |= {
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        }
        refused = _run(["scripts/hk3s", "--stack", "local", "preview"], project_copy, bare)
        assert refused.returncode != 0, refused.stderr[-3000:]
        last = refused.stderr.strip().splitlines()[-1]
        assert "secrets provider awskms://" in last and "has no credentials" in last and "AWS_ACCESS_KEY_ID" in last, (
            last
        )
