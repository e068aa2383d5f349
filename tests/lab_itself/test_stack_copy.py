"""A lab stack's project copy carries the project's bytecode.

Every program run and dynamic-provider process of a lab stack imports the project from the
stack's copy. Where PYTHONDONTWRITEBYTECODE is set (CI machines set it) nothing writes a .pyc,
so without bytecode in the copy each of those processes compiles every project module it
imports from source. Checked with a real interpreter importing from a real copy; no lab hosts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lab.stack_harness import REPO, LabStack

# Counts the project modules a fresh interpreter compiles from source while it imports what a
# provider process and the program import.
COUNT_COMPILES = """
import importlib._bootstrap_external as external, os, sys
compiled = []
original = external.SourceLoader.source_to_code
def counting(self, data, path, *args, **kwargs):
    if os.path.realpath(path).startswith(os.path.realpath(os.getcwd()) + os.sep):
        compiled.append(path)
    return original(self, data, path, *args, **kwargs)
external.SourceLoader.source_to_code = counting
sys.path.insert(0, os.getcwd())
import providers, providers.node_join, providers.node_fence, components, node_operations.join
print(len(compiled))
for path in compiled[:5]:
    print(path)
"""


def test_the_copy_imports_the_project_without_compiling_it(tmp_path: Path) -> None:
    stack = LabStack(tmp_path)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", COUNT_COMPILES], cwd=stack.project, env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "0", f"modules compiled from source in the copy {stack.project}: {out[1:]}"
    assert stack.project != REPO
