"""The dependencies the program declares grow in proportion to the workers, not with their square.

Under Pulumi mocks (tests/components/mock_engine.py): what is counted is what the engine would
receive, each resource's `dependencies` (its `depends_on` entries and the resources its inputs come
from, a component expanded to its children, as the SDK sends them); counting them needs no engine
and no host. The Pulumi SDK walks every resource reachable from each dependency a resource declares
(its cycle check, `pulumi/runtime/resource_cycle_breaker.py`), so a per-worker resource that depends
on every worker's resources makes the program's own time grow faster than the square of the
workers (bench/scale_program.py measures it).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.scale_program import stack_config
from cluster_settings import load_settings
from components.program import build_cluster, read_credentials
from tests.components.mock_engine import run_with_mocks


def _dependencies_by_type(workers: int, key_file: Path) -> Counter[str]:
    """The dependencies declared in the program of a server and `workers` existing workers, summed
    per resource type."""
    settings = load_settings(stack_config(workers, key_file))
    recording = run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)))
    counts: Counter[str] = Counter()
    for registration in recording.registrations:
        counts[registration.type.rsplit(":", 1)[-1]] += len(registration.dependencies)
    return counts


def test_the_dependencies_declared_grow_linearly_with_the_workers(ssh_key_file: Path) -> None:
    small, large = _dependencies_by_type(20, ssh_key_file), _dependencies_by_type(40, ssh_key_file)
    # Twice the workers: about twice the dependencies (the server's share is fixed); all-to-all
    # lists would make it four times.
    grown = {kind: (small[kind], large[kind]) for kind in large if large[kind] > 2.2 * small[kind] + 10}
    assert large.total() <= 2.2 * small.total(), (
        f"20 workers: {small.total()} dependencies, 40 workers: {large.total()}; "
        f"grown faster than the workers (20 -> 40): {grown}"
    )


def test_a_barrier_is_one_dependency_and_no_provider_call(ssh_key_file: Path) -> None:
    """What a barrier must be (components.barrier): not custom (the engine calls no provider for
    it), recorded by its dependents as itself, not expanded to what it waits for."""
    settings = load_settings(stack_config(3, ssh_key_file))
    graph = run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)))
    barriers = {r.name: r for r in graph.of_type(":Barrier")}
    assert sorted(barriers) == ["firewalls-in-place", "login-key-holders"]
    assert all(not r.custom and r.provider == "" for r in barriers.values())
    in_place = barriers["firewalls-in-place"]
    firewalls = {r.urn for r in graph.of_type("hk3s:HostFirewall")}
    assert len(firewalls) == 4 and firewalls <= set(in_place.dependencies)
    join = graph.by_name("w0-join")
    assert in_place.urn in join.dependencies
    # The worker's own firewall directly (its delete comes after the join's), the others through it.
    assert firewalls & set(join.dependencies) == {graph.urn_of("w0-firewall")}
    holders = barriers["login-key-holders"]
    for retired in graph.of_type("hk3s:RetiredLoginKeys"):
        # Besides the barrier: the roster (all made after it waits for it), its node's probe (the host key its login pins).
        node = retired.inputs["node"]
        expected = {holders.urn, graph.urn_of("workers"), graph.urn_of(f"{node}-probe")}
        assert set(retired.dependencies) == expected, retired.name
