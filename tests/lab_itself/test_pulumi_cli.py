"""The lab's real Pulumi CLI and Python language host, driven through the Automation API.

Needs the files built by ``lab/build/pulumi.sh`` in ``$HK3S_LAB_CACHE/bin`` (default
/var/cache/hk3s-lab/bin); skips only when they are absent, and fails on any other error.

A tiny Python program with one dynamic resource (its provider writes a file on create and
removes it on delete) goes through ``pulumi stack init``, ``pulumi up`` and ``pulumi destroy``
against a local file backend, entirely offline.

The language host the proxy can give us is the one shipped inside sdk/v3 v3.79.0 (see the
pins in lab/build/pulumi.sh).  It learns the Pulumi.yaml runtime options only from command
line flags, which current CLIs no longer pass, so it runs the program with
``$PULUMI_PYTHON_CMD``; the test points that at the venv's python.  The CLI itself still hands
the options to the dynamic provider (``PULUMI_RUNTIME_VIRTUALENV``), and a current language
host would use the ``virtualenv`` option and ignore ``PULUMI_PYTHON_CMD``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.stack_harness import BIN, CACHE, skip_without_lab_binaries

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "lab" / "build" / "pulumi.sh"
BIN_DIR = BIN
FILES = ("pulumi", "pulumi-language-python", "pulumi-language-python-exec", "pulumi-resource-pulumi-python")

PROJECT = "hk3s-lab-cli-check"
CONTENT = "written by a Python dynamic provider\n"

PULUMI_YAML = """\
name: {project}
description: lab check of the Pulumi CLI and Python language host
runtime:
  name: python
  options:
    toolchain: pip
    virtualenv: {venv}
"""

PROGRAM = textwrap.dedent(
    '''\
    """One Python dynamic resource: a file that exists exactly while the resource does."""

    import os

    import pulumi
    from pulumi.dynamic import CreateResult, Resource, ResourceProvider


    class MarkerFileProvider(ResourceProvider):
        def create(self, props):
            with open(props["path"], "x", encoding="utf-8") as f:
                f.write(props["content"])
            return CreateResult(id_=props["path"], outs=dict(props))

        def delete(self, id, props):
            os.remove(props["path"])


    class MarkerFile(Resource):
        path: pulumi.Output[str]
        content: pulumi.Output[str]

        def __init__(self, name, path, content, opts=None):
            super().__init__(MarkerFileProvider(), name, {"path": path, "content": content}, opts)


    config = pulumi.Config()
    marker = MarkerFile("marker", config.require("markerPath"), config.require("content"))
    pulumi.export("markerPath", marker.path)
    pulumi.export("markerContent", marker.content)
    '''
)


def _require_binaries() -> None:
    skip_without_lab_binaries(*FILES)


def _venv() -> Path:
    """The virtual environment running this test (it has the pulumi SDK): Pulumi.yaml points at it."""
    venv = Path(os.environ.get("HK3S_LAB_VENV", sys.prefix))
    if not (venv / "pyvenv.cfg").is_file() or not (venv / "bin" / "python").exists():
        raise AssertionError(
            f"{venv} is not a virtual environment: run pytest from the project's venv or set HK3S_LAB_VENV"
        )
    return venv


def _pinned_version() -> str:
    return subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-version"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A project directory (its Pulumi.yaml only) and the environment that runs the lab's CLI on
    it with a local state directory."""
    _require_binaries()
    venv = _venv()
    work_dir = tmp_path / "program"
    work_dir.mkdir()
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (work_dir / "Pulumi.yaml").write_text(PULUMI_YAML.format(project=PROJECT, venv=venv))
    env = {
        "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_CONFIG_PASSPHRASE": "hk3s-lab-passphrase",
        "PULUMI_BACKEND_URL": state_dir.as_uri(),
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_PYTHON_CMD": str(venv / "bin" / "python"),
    }
    return work_dir, env


def test_python_dynamic_resource_up_and_destroy(tmp_path: Path) -> None:
    work_dir, env = _project(tmp_path)
    marker = tmp_path / "marker.txt"
    (work_dir / "__main__.py").write_text(PROGRAM)
    workspace = auto.LocalWorkspace(
        work_dir=str(work_dir),
        pulumi_home=str(tmp_path / "pulumi-home"),
        env_vars=env,
        pulumi_command=auto.PulumiCommand(root=str(CACHE)),
    )
    pinned = _pinned_version()
    assert f"v{workspace.pulumi_version}" == pinned, (
        f"{BIN_DIR}/pulumi is v{workspace.pulumi_version} but lab/build/pulumi.sh pins {pinned}: rerun the script"
    )

    output: list[str] = []
    stack = auto.Stack.create("lab", workspace)  # pulumi stack init
    try:
        stack.set_all_config({"markerPath": auto.ConfigValue(str(marker)), "content": auto.ConfigValue(CONTENT)})

        up = stack.up(color="never", on_output=output.append)  # pulumi up --yes
        log = "\n".join(output)
        assert up.summary.result == "succeeded", log
        assert up.summary.resource_changes == {"create": 2}, log
        assert up.outputs["markerPath"].value == str(marker), log
        assert up.outputs["markerContent"].value == CONTENT, log
        assert marker.read_text(encoding="utf-8") == CONTENT

        output.clear()
        destroy = stack.destroy(color="never", on_output=output.append)  # pulumi destroy --yes
        log = "\n".join(output)
        assert destroy.summary.result == "succeeded", log
        assert destroy.summary.resource_changes == {"delete": 2}, log
        assert not marker.exists(), f"{marker} survived pulumi destroy\n{log}"
        assert stack.outputs() == {}
    finally:
        workspace.remove_stack("lab", force=True)


def test_config_set_still_tells_a_secret_from_a_dictionary_word(tmp_path: Path) -> None:
    """The lab's CLI decodes zxcvbn's word lists on first use (lab/build/pulumi.sh,
    lazy_word_lists), not at every start: `pulumi config set` of a plaintext value under a
    secret-looking key must still judge it with the lists loaded. A random token is refused;
    "password1password" (16 characters, as many as the check reads) is a dictionary word twice,
    low in entropy only when the lists are there (without them it is 16 characters of brute force,
    over the threshold, and refused too)."""
    work_dir, project_env = _project(tmp_path)
    env = {**os.environ, **project_env, "PULUMI_HOME": str(tmp_path / "pulumi-home")}

    def pulumi(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["pulumi", *args, "--non-interactive"],
            check=False,
            cwd=work_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert pulumi("stack", "init", "lab").returncode == 0
    token = pulumi("config", "set", "apiToken", "q7Xv2LmZ9kRt4WpYc8Nb3Hs6Jd1Fg5Ke")
    assert token.returncode != 0
    assert "looks like a secret" in token.stderr, token.stderr
    word = pulumi("config", "set", "apiPassword", "password1password")
    assert word.returncode == 0, word.stderr
    assert pulumi("config", "get", "apiPassword").stdout.strip() == "password1password"
