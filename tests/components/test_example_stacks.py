"""The example stacks (`Pulumi.dev.yaml`, `Pulumi.staging.yaml`) as shipped: their first `up`
must be able to succeed with nothing but a Hetzner token and an SSH key.

Every check that needs no machine is run on them as the engine would run it: the settings'
rules, the Hetzner project's catalogue and names (Hetzner is a Pulumi mock here; it cannot be
reached), and each dynamic resource's `check`, which the engine calls at `preview` before any
machine is touched, in a run nobody watches (`CI` set) as in CI. An example listing a host
nobody has (an address from a documentation range) fails here: its first contact has no key
pinned, so a non-interactive preview refuses it, and an interactive one waits
hk3s:ssh.first_contact_seconds for it after every Hetzner server was created.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import dill
import pytest
import yaml

from cluster_settings import load_settings
from components.program import build_cluster, read_credentials
from tests.components.mock_engine import Recording, run_with_mocks
from tests.components.test_hetzner_host_keys import KeyMocks

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ("dev", "staging")


def _shipped(stack: str) -> dict[str, Any]:
    document = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())
    return {key.split(":", 1)[1]: value for key, value in document["config"].items() if key.startswith("hk3s:")}


def _with_key(config: dict[str, Any], key_file: Path) -> dict[str, Any]:
    # The one thing a user supplies besides the token: the key (the example names ~/.ssh/id_ed25519).
    config = json.loads(json.dumps(config))
    config["ssh"]["private_key_file"] = str(key_file)
    return config


def _plain(value: Any) -> Any:
    """An input as the engine received it, a secret's wrapper taken off."""
    if isinstance(value, dict) and set(value) >= {"value"} and len(value) <= 2:
        return _plain(value["value"])
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _check_failures(recording: Recording) -> list[str]:
    """What each dynamic resource's provider `check` refuses, as the engine would ask at preview."""
    failures = []
    for registration in recording.registrations:
        if "pulumi-python:dynamic" not in registration.type:
            continue
        inputs = _plain(registration.inputs)
        provider = dill.loads(base64.b64decode(inputs.pop("__provider")))
        result = provider.check({}, inputs)
        failures += [f"{registration.name}.{failure.property}: {failure.reason}" for failure in result.failures or []]
    return failures


def _build(config: dict[str, Any], stack: str) -> Recording:
    settings = load_settings(config)
    return run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)), mocks=KeyMocks(), stack=stack)


@pytest.mark.parametrize("stack", EXAMPLES)
def test_the_example_as_shipped_passes_every_check_that_needs_no_machine(
    stack: str, ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")  # as in CI: nobody watches the first contact with a host
    recording = _build(_with_key(_shipped(stack), ssh_key_file), stack)
    probes = recording.of_type("hk3s:HostProbe")
    assert probes, "the example builds no node"
    assert _check_failures(recording) == []
    # Only machines the run creates: nothing waits for a host that is not there.
    settings = load_settings(_with_key(_shipped(stack), ssh_key_file))
    assert [host.name for host in [settings.server, *settings.all_workers()] if host.kind != "hetzner"] == []


@pytest.mark.parametrize("stack", EXAMPLES)
def test_the_example_names_no_documentation_address(stack: str) -> None:
    """192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24 (RFC 5737) are for documentation: a setting
    holding one is a placeholder, so the example is not ready as shipped while one is set."""
    config = _shipped(stack)
    text = json.dumps(config)
    assert not re.search(r"\b(192\.0\.2|198\.51\.100|203\.0\.113)\.\d", text), text


def existing_host_example(stack: str) -> dict[str, Any]:
    """The commented existing-host entry of the example, uncommented."""
    lines = (REPO / f"Pulumi.{stack}.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^\s*# - name: \S+", line))
    indent = lines[start].index("#")
    block: list[str] = []
    for line in lines[start:]:
        if not line.startswith(" " * indent + "# ") or (block and line[indent + 2 :].startswith("-")):
            break
        block.append(line[indent + 2 :])
    (entry,) = yaml.safe_load("\n".join(block))
    return dict(entry)


def test_the_commented_existing_host_is_valid_and_takes_its_pool(ssh_key_file: Path) -> None:
    config = _with_key(_shipped("dev"), ssh_key_file)
    entry = existing_host_example("dev")
    assert entry["kind"] == "existing"
    config["workers"].append(entry)
    settings = load_settings(config)
    assert ("existing", entry["name"]) in [(w.kind, w.name) for w in settings.workers]
    recording = _build(config, "dev")
    joins = {r.name: r for r in recording.registrations if r.type.endswith("hk3s:NodeJoin")}
    assert joins[f"{entry['name']}-join"].inputs["taints"] == ["dedicated=batch:NoSchedule"]
