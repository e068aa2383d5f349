"""No pod is force-deleted without a recorded fence.

A pod deleted with a grace period of zero (or `--force`) is gone from the API at once, while
its containers may still run and write on a node that only lost its network: its controller
starts a second copy beside the first. The product's one way to have pods force-deleted is the
fence (node_operations/fence.py), which proves the node stopped and records it first; there,
Kubernetes' pod garbage collector does the deleting. This test reads every product source
file and fails on any force-deletion written anywhere else.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

from node_operations.fence import FENCE_STOPPED_BY_ANNOTATION
from node_operations.forced_removal import incomplete_fence
from node_operations.health import FENCE_ANNOTATION

REPO = Path(__file__).resolve().parents[1]
PRODUCT = (
    "__main__.py",
    "cluster_settings",
    "components",
    "providers",
    "node_operations",
    "remote_access",
    "host_scripts",
    "operator_api",
    "operator_cli",
    "scripts",
)
# None: the fence taints the node out of service and Kubernetes' pod garbage collector deletes the
# pods left terminating there. The fence deletes no pod itself: a pod Kubernetes has not deleted
# keeps its volume's VolumeAttachment to the worker (the attach-detach controller releases a volume
# only once its pod is terminated or gone), so the fence could never prove that volume released.
ALLOWED: set[str] = set()
# kubectl's ways to skip a pod's graceful termination (`--now` is a grace period of 1 s: graceful).
FORCE_WORDS = re.compile(r"(?<![\w-])(--force|--grace-period[= ]+0+)(?![\w-])")
GRACE_ZERO_KEYS = {"grace_period_seconds", "gracePeriodSeconds", "grace_period"}


def _zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def python_force_deletions(source: str) -> list[tuple[int, str]]:
    """Where a Python source asks for a force-deletion: a kubectl argument `--force` or
    `--grace-period=0` (alone, or within a command line), `--grace-period` followed by "0",
    or a grace period of zero passed by keyword or in a dict (an API client's delete options)."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    # The name of a command-line option the program defines (argparse's add_argument) is not an
    # argument sent to kubectl: the CLI's own `node remove --force` gives up a fenced worker.
    option_names = {
        id(call.args[0])
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "add_argument"
        and call.args
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) in option_names:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            # Command lines as strings; a docstring naming another tool's --force is prose, not a call.
            text = node.value
            if FORCE_WORDS.search(text) and (text.startswith("--") or "kubectl" in text):
                found.append((node.lineno, text))
        elif isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and str(head.value).startswith(("--grace-period", "--force")):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.List | ast.Tuple):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            for word, following in itertools.pairwise(words):
                if word == "--grace-period" and str(following).strip("0") == "":
                    found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg in GRACE_ZERO_KEYS and _zero(keyword.value):
                    found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in GRACE_ZERO_KEYS and _zero(value):
                    found.append((node.lineno, ast.unparse(node)))
    return found


def shell_force_deletions(source: str) -> list[tuple[int, str]]:
    """Where a shell script force-deletes through kubectl (other tools' --force, e.g. ufw's, are
    not pod deletions)."""
    return [
        (number, line.strip())
        for number, line in enumerate(source.splitlines(), 1)
        if "kubectl" in line and FORCE_WORDS.search(line)
    ]


def product_files() -> Iterator[Path]:
    for name in PRODUCT:
        path = REPO / name
        if path.is_file():
            yield path
        else:
            yield from (p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts)


def test_the_scan_finds_every_way_of_writing_a_force_deletion() -> None:
    # The scan itself, on code that force-deletes in each way it knows (else it could pass by finding nothing).
    force = [
        'api.kubectl(["delete", "pod", name, "--force", "--grace-period=0"])',
        'api.kubectl(["delete", "pod", name, "--grace-period", "0"])',
        'run(f"--grace-period={seconds}")',
        'session.run(["sh", "-c", "k3s kubectl delete pods -A --force"])',
        "client.delete_namespaced_pod(name, namespace, grace_period_seconds=0)",
        'body = {"kind": "DeleteOptions", "gracePeriodSeconds": 0}',
        # An option's name is skipped only as add_argument's first argument, not elsewhere in it.
        'parser.add_argument("--yes", default=["kubectl", "delete", "pod", "--force"])',
    ]
    for source in force:
        assert python_force_deletions(source), source
    graceful = [
        'api.kubectl(["delete", "pod", name, "--ignore-not-found", "--wait=false"])',
        'api.kubectl(["apply", "--server-side", "--force-conflicts", "-f", "-"])',
        'api.kubectl(["delete", "pod", name, "--grace-period=30"])',
        '"""Enable it last with `ufw --force enable`."""',
        "client.delete_namespaced_pod(name, namespace, grace_period_seconds=30)",
        'remove.add_argument("--force", action="store_true", help="give up a fenced worker")',
    ]
    for source in graceful:
        assert not python_force_deletions(source), source
    assert shell_force_deletions("k3s kubectl delete pod web --grace-period=0 --force\n")
    assert not shell_force_deletions("ufw --force enable >/dev/null\nkubectl delete pod web\n")


def test_no_product_code_force_deletes_a_pod_outside_the_fence() -> None:
    found = []
    scanned = 0
    for path in product_files():
        relative = path.relative_to(REPO).as_posix()
        text = path.read_text(errors="replace")
        if path.suffix == ".py":
            hits = python_force_deletions(text)
        elif path.suffix == ".sh" or text.startswith("#!"):
            hits = shell_force_deletions(text)
        else:
            continue
        scanned += 1
        if relative not in ALLOWED:
            found += [f"{relative}:{line}: {code}" for line, code in hits]
    assert scanned > 50  # the product's files were read (a moved package would scan nothing)
    assert not found, "force-deletion without a fence:\n" + "\n".join(found)


# Deleting a Node is a force-deletion of every pod bound to it: the pod garbage collector deletes
# at once (no grace) the pods of a Node that no longer exists, so their controllers start them
# elsewhere while the old containers may still write. Where the product deletes a Node, and the
# step that must come first in the same function: the give-up, after its fence is judged complete
# (recorded, the host proven stopped, the out-of-service taint on); the removal, after the host
# answered and was wiped (its agent and every container stopped).
NODE_DELETIONS = {
    "node_operations/forced_removal.py": ("give_up_worker", "judge_give_up"),
    "node_operations/worker_removal.py": ("_deregister", None),
}
NODE_RESOURCES = {"node", "nodes", "no"}
COMMAND_LINE_NODE_DELETE = re.compile(r"(\S*/)?(k3s\s+)?kubectl\s+delete\s+(nodes?|no)\b")


def python_node_deletions(source: str) -> list[tuple[int, str, str]]:
    """Where a Python source deletes a Node: a kubectl argument list `delete node ...` (or
    `nodes`, `no`, `node/NAME`), an API client's `delete_node(...)`; with the enclosing function."""
    found: list[tuple[int, str, str]] = []
    tree = ast.parse(source)
    functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]

    def enclosing(line: int) -> str:
        inside = [f for f in functions if f.lineno <= line <= (f.end_lineno or f.lineno)]
        return max(inside, key=lambda f: f.lineno).name if inside else ""

    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            words = [str(e.value) for e in node.elts if isinstance(e, ast.Constant)]
            for word, following in itertools.pairwise(words):
                if word == "delete" and (following in NODE_RESOURCES or following.startswith("node/")):
                    found.append((node.lineno, enclosing(node.lineno), ast.unparse(node)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # A command line run as a string (it starts with the command); prose advising a person,
            # "... (kubectl delete node <name>)", does not.
            if COMMAND_LINE_NODE_DELETE.match(node.value.strip()):
                found.append((node.lineno, enclosing(node.lineno), node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "delete_node":
            found.append((node.lineno, enclosing(node.lineno), ast.unparse(node)))
    return found


def test_the_node_deletion_scan_finds_every_way_of_writing_one() -> None:
    deleting = [
        'async def f():\n    await api.kubectl(["delete", "node", name, "--ignore-not-found"])',
        'def f():\n    run(["kubectl", "delete", "nodes", "--all"])',
        'def f():\n    run(["k3s", "kubectl", "delete", "node/w1"])',
        'def f():\n    session.run(["sh", "-c", "k3s kubectl delete node w1"])',
        "def f():\n    core.delete_node(name)",
    ]
    for source in deleting:
        assert [hit[1] for hit in python_node_deletions(source)] == ["f"], source
    keeping = [
        'raise RuntimeError("the Node is gone. Find out why (a give-up, a kubectl delete node), then run up")',
        'api.kubectl(["delete", "pod", name])',
        'api.kubectl(["delete", "lease", name, "-n", "kube-node-lease"])',
        'api.kubectl(["get", "node", name])',
    ]
    for source in keeping:
        assert not python_node_deletions(source), source


def test_a_node_is_deleted_only_after_its_host_is_proven_stopped() -> None:
    found = []
    for path in product_files():
        if path.suffix != ".py":
            if (path.suffix == ".sh" or path.read_text(errors="replace").startswith("#!")) and re.search(
                r"kubectl\s+delete\s+(nodes?|no)\b", path.read_text(errors="replace")
            ):
                found.append(f"{path.relative_to(REPO).as_posix()}: a shell script deletes a Node")
            continue
        relative = path.relative_to(REPO).as_posix()
        for line, function, code in python_node_deletions(path.read_text(errors="replace")):
            allowed = NODE_DELETIONS.get(relative)
            if allowed is None or function != allowed[0]:
                found.append(f"{relative}:{line} ({function}): {code}")
    assert not found, "a Node deleted outside the give-up and the removal:\n" + "\n".join(found)
    # The give-up judges the fence complete before its delete, in the same function.
    source = (REPO / "node_operations/forced_removal.py").read_text()
    tree = ast.parse(source)
    give_up = next(f for f in ast.walk(tree) if isinstance(f, ast.AsyncFunctionDef) and f.name == "give_up_worker")
    calls = [c for c in ast.walk(give_up) if isinstance(c, ast.Call)]
    judged = [c.lineno for c in calls if isinstance(c.func, ast.Name) and c.func.id == "judge_give_up"]
    deleted = [line for line, function, _ in python_node_deletions(source) if function == "give_up_worker"]
    assert judged and deleted and max(judged) < min(deleted), (judged, deleted)
    # The removal deregisters only after the wipe, in the same function.
    removal = ast.parse((REPO / "node_operations/worker_removal.py").read_text())
    remove = next(f for f in ast.walk(removal) if isinstance(f, ast.AsyncFunctionDef) and f.name == "_remove")
    names = {
        c.lineno: (c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", ""))
        for c in ast.walk(remove)
        if isinstance(c, ast.Call)
    }
    wiped = [line for line, name in names.items() if name == "wipe_node"]
    deregistered = [line for line, name in names.items() if name == "_deregister"]
    assert wiped and deregistered and max(wiped) < min(deregistered), (wiped, deregistered)


def test_a_fence_that_did_not_complete_gives_nothing_up() -> None:
    """The judgement the give-up runs before its delete: a Node without the out-of-service taint
    (its fence recorded but stopped before the host was proven stopped) is not given up; nor one
    whose taint came without the fence's record that the host was proven stopped (a taint put on
    by hand)."""
    recorded = {"metadata": {"annotations": {FENCE_ANNOTATION: "2026-12-04T10:00:00Z"}}, "spec": {}}
    refusal = incomplete_fence("w2", recorded)
    assert refusal is not None and "the fence of w2 recorded at 2026-12-04T10:00:00Z did not complete" in refusal
    taint = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
    by_hand = incomplete_fence("w2", {**recorded, "spec": {"taints": [taint]}})
    assert by_hand is not None and "did not complete" in by_hand and FENCE_STOPPED_BY_ANNOTATION in by_hand
    assert "A taint put on by hand" in by_hand and "proves nothing about the host" in by_hand
    completed = {
        "metadata": {"annotations": {FENCE_ANNOTATION: "2026-12-04T10:00:00Z", FENCE_STOPPED_BY_ANNOTATION: "ssh"}},
        "spec": {"taints": [taint]},
    }
    assert incomplete_fence("w2", completed) is None
    stopped_untainted = incomplete_fence("w2", {**completed, "spec": {}})
    assert stopped_untainted is not None and "did not complete" in stopped_untainted
    unfenced = incomplete_fence("w2", {"metadata": {}, "spec": completed["spec"]})
    assert unfenced is not None and "w2 is not fenced" in unfenced
