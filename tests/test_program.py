"""The program entry point and the example stack. The engine is mocked
(Pulumi mocks; Hetzner cannot be reached from here)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi.runtime import config as runtime_config

from cluster_settings import SettingsError, load_settings
from cluster_settings.reference import BEGIN_MARKER, END_MARKER, render_reference, write_reference
from tests.components.mock_engine import Recording, run_with_mocks
from tests.components.test_example_stacks import existing_host_example

REPO = Path(__file__).resolve().parents[1]


def _stack_config(name: str) -> dict[str, Any]:
    document = yaml.safe_load((REPO / f"Pulumi.{name}.yaml").read_text())
    return {key.split(":", 1)[1]: value for key, value in document["config"].items() if key.startswith("hk3s:")}


def _with_key(config: dict[str, Any], key_file: Path) -> dict[str, Any]:
    config = json.loads(json.dumps(config))
    config["ssh"]["private_key_file"] = str(key_file)
    return config


def _withexisting_host_example(config: dict[str, Any]) -> dict[str, Any]:
    """The dev example with its commented existing-host entry uncommented."""
    config["workers"].append(existing_host_example("dev"))
    return config


def test_example_dev_stack_is_valid(ssh_key_file: Path) -> None:
    settings = load_settings(_with_key(_stack_config("dev"), ssh_key_file))
    kinds = sorted((w.kind, w.name) for w in settings.workers)
    # As shipped, only Hetzner servers the program creates (a first up needs a token and a key).
    assert kinds == [("hetzner", "dev-worker-1"), ("hetzner", "dev-worker-2")]
    settings = load_settings(_withexisting_host_example(_with_key(_stack_config("dev"), ssh_key_file)))
    kinds = sorted((w.kind, w.name) for w in settings.workers)
    assert kinds == [("existing", "dev-metal-1"), ("hetzner", "dev-worker-1"), ("hetzner", "dev-worker-2")]


def _run_main(config: dict[str, Any], recording: Recording | None = None) -> Recording:
    runtime_config.set_all_config({f"hk3s:{key}": json.dumps(value) for key, value in config.items()})
    try:
        return run_with_mocks(lambda: runpy.run_path(str(REPO / "__main__.py"), run_name="__main__"), recording)
    finally:
        runtime_config.set_all_config({})


def test_main_builds_the_dev_stack(ssh_key_file: Path) -> None:
    recording = _run_main(_with_key(_stack_config("dev"), ssh_key_file))
    components = sorted(r.name for r in recording.registrations if r.type == "hk3s:index:WorkerNode")
    assert components == ["batch-1", "batch-2", "dev-worker-1", "dev-worker-2"]
    recording = _run_main(_withexisting_host_example(_with_key(_stack_config("dev"), ssh_key_file)))
    components = sorted(r.name for r in recording.registrations if r.type == "hk3s:index:WorkerNode")
    assert components == ["batch-1", "batch-2", "dev-metal-1", "dev-worker-1", "dev-worker-2"]
    # The example's pool: its two servers in turn over its locations, its taint on the existing
    # host that names it too.
    servers = {r.name: r for r in recording.registrations if r.type == "hcloud:index/server:Server"}
    assert [servers[name].inputs["location"] for name in ("batch-1", "batch-2")] == ["fsn1", "nbg1"]
    joins = {r.name: r for r in recording.registrations if r.type.endswith("hk3s:NodeJoin")}
    assert joins["dev-metal-1-join"].inputs["taints"] == ["dedicated=batch:NoSchedule"]


def test_invalid_config_fails_before_any_resource(ssh_key_file: Path) -> None:
    config = _with_key(_stack_config("dev"), ssh_key_file)
    config["workers"][1]["name"] = "dev-worker-1"
    recording = Recording()
    with pytest.raises(SettingsError, match=r"hk3s:workers\[1\]\.name"):
        _run_main(config, recording)
    assert recording.registrations == []


def test_misspelt_top_level_key_is_reported(ssh_key_file: Path) -> None:
    config = _with_key(_stack_config("dev"), ssh_key_file)
    config["worker"] = config.pop("workers")
    with pytest.raises(SettingsError, match="hk3s:worker: is not a setting"):
        _run_main(config)


def test_the_reference_is_written_into_the_page_between_its_markers(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"
    page.write_text(f"# Configuration reference\n\nprose\n\n{BEGIN_MARKER}\nOLD TABLES\n{END_MARKER}\n\nafter\n")
    write_reference(page)
    text = page.read_text()
    assert "OLD TABLES" not in text and text.startswith("# Configuration reference\n\nprose\n\n")
    assert (
        text[text.index(BEGIN_MARKER) + len(BEGIN_MARKER) : text.index(END_MARKER)].strip()
        == render_reference().strip()
    )
    assert text.endswith(f"{END_MARKER}\n\nafter\n")


def test_docs_configuration_reference_is_current() -> None:
    page = (REPO / "docs" / "configuration.md").read_text()
    start = page.index(BEGIN_MARKER) + len(BEGIN_MARKER)
    end = page.index(END_MARKER)
    assert page[start:end].strip() == render_reference().strip(), (
        "docs/configuration.md's reference is stale: regenerate it with python -m cluster_settings.reference"
    )
