"""Every dynamic provider survives the engine's round trip: serialized with the
SDK's own `serialize_provider` (dill) here, deserialized in a fresh Python
process the way `python -m pulumi.dynamic` does it."""

from __future__ import annotations

import base64
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pulumi.dynamic import ResourceProvider
from pulumi.dynamic.dynamic import serialize_provider

from providers import ALL_PROVIDERS
from providers.base import NodeProvider
from providers.bootstrap_firewall import BootstrapFirewallReleaseProvider
from providers.host_key_pair import HostKeyPairProvider
from providers.network_plan import NetworkPlanProvider
from providers.network_ranges import NetworkRangesProvider
from providers.project_ssh_key import ProjectSshKeyProvider
from providers.stack_identity import StackIdentityProvider
from providers.teardown_guard import TeardownGuardProvider
from providers.worker_roster import WorkerRosterProvider

REPO = Path(__file__).resolve().parents[2]
# Third-party packages a provider process needs only once it reaches a host or an API.
HEAVY_PACKAGES = ("asyncssh", "hcloud", "requests")
# The provider modules every provider builds on.
SHARED_PROVIDER_MODULES = ("providers.base", "providers.inputs", "providers.engine_watch")


@pytest.mark.parametrize("provider_class", ALL_PROVIDERS, ids=lambda cls: cls.__name__)
def test_provider_unpickles_in_a_fresh_process(provider_class: type, tmp_path: Path) -> None:
    blob = serialize_provider(provider_class())
    # Same bytes when serialized twice: no spurious diff of __provider on every preview.
    assert blob == serialize_provider(provider_class())
    (tmp_path / "provider.b64").write_text(blob)
    script = textwrap.dedent(
        f"""
        import base64, dill, sys
        provider = dill.loads(base64.b64decode(open({str(tmp_path / "provider.b64")!r}).read()))
        result = provider.check({{"network_range": "10.0.0.0/16"}}, {{"node": "Not_A_Name", "address": "198.51.100.7", "private_key": "k", "mode_setting": "sideways", "network_range": "10.9.0.0/16", "server_id": "server-1"}})
        heavy = sorted({{name.split(".")[0] for name in sys.modules}} & set({HEAVY_PACKAGES!r}))
        providers = sorted(name for name in sys.modules if name.startswith("providers.") and name not in {SHARED_PROVIDER_MODULES!r})
        print(type(provider).__module__, type(provider).__name__, ",".join(heavy) or "-", ",".join(providers), [f.property for f in result.failures])
        """
    )
    # A fresh interpreter started in the project directory, like the provider process.
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    module, name, heavy, loaded_providers, failures = completed.stdout.split(" ", 4)
    assert (module, name) == (provider_class.__module__, provider_class.__name__)
    # Start-up cost: the engine starts a provider process per provider shard and command, most
    # answering only Check and Diff. Unpickling one provider and checking imports neither the
    # SSH or cloud libraries (they load when a create, update or delete uses them) nor the
    # other provider modules.
    assert heavy == "-", f"{name} imports {heavy} to unpickle and check"
    assert loaded_providers == provider_class.__module__, f"{name} imports {loaded_providers}"
    # The unpickled provider works: its check still rejects a bad node name (the network
    # plan, which acts on no single node, a bad mode; the network ranges, a changed range; the
    # bootstrap firewall's release, a server id that is not Hetzner's; the project key, a
    # missing public key). The stack-wide providers that check nothing of these inputs (or
    # nothing at all) accept them.
    expected: dict[type, str] = {
        NetworkPlanProvider: "'mode_setting'",
        NetworkRangesProvider: "'network_range'",
        BootstrapFirewallReleaseProvider: "'server_id'",
        ProjectSshKeyProvider: "'public_key'",
        HostKeyPairProvider: "[]",
        StackIdentityProvider: "[]",
        TeardownGuardProvider: "[]",
        WorkerRosterProvider: "[]",
    }
    assert expected.get(provider_class, "'node'") in failures


def test_providers_are_pickled_by_reference_not_by_value() -> None:
    # By reference means the provider process imports the project's modules, so
    # a fix to a provider takes effect without replacing every resource.
    for provider_class in ALL_PROVIDERS:
        raw = base64.b64decode(serialize_provider(provider_class()))
        assert provider_class.__module__.encode() in raw
        assert b"co_code" not in raw and len(raw) < 2000, provider_class.__name__


def test_every_provider_class_of_the_package_is_walked_here() -> None:
    # A provider left out of ALL_PROVIDERS would go unchecked above: its round trip, its
    # import cost and its stable bytes (a changed blob is a diff on every preview).
    defined = set()
    for path in sorted((REPO / "providers").glob("*.py")):
        module = importlib.import_module(f"providers.{path.stem}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, ResourceProvider)
                and value.__module__ == module.__name__
                and value is not NodeProvider
            ):
                defined.add(value.__name__)
    assert sorted(defined - {cls.__name__ for cls in ALL_PROVIDERS}) == []
