"""The shell commands the documentation shows, each with the file that runs it.

`tests/test_docs.py` accepts a command line of a ```bash block in README.md, docs/*.md or
bench/README.md only when it is an `scripts/hk3s` line (parsed by the CLI's own parser), a
`venv/bin/python -m <module>` line (the module must exist), or a key of `RUN_BY` below. Each
entry names the file that runs the command and the exact text in that file that runs it (or
reads it from the page and asserts it), and that test module checks the text is there. A
`pulumi ...` or `scripts/stack.sh ...` command must be run by a lab test (a file under
tests/lab/): those are the commands that have been wrong for some stacks, and only the lab runs
them against real hosts and the real Pulumi engine.

Keys are written as the docs write them, with leading `VAR=value` assignments and `sudo`
dropped and words joined by single spaces; `<env>` stays, the lab tests put their stack's name
in its place.
"""

from __future__ import annotations

from typing import NamedTuple


class RunBy(NamedTuple):
    path: str  # the file, relative to the repository
    text: str  # the text in it that runs the command (or asserts it is the documented one)


RUN_BY: dict[str, RunBy] = {
    # docs/recovery.md: read from the page and typed, in test_the_readme_recovery_commands_finish_a_killed_run.
    "pulumi cancel --yes --stack <env>": RunBy(
        "tests/lab/test_longhorn_teardown.py", '"pulumi cancel --yes --stack <env>"'
    ),
    "pulumi refresh --run-program --clear-pending-creates --yes --stack <env>": RunBy(
        "tests/lab/test_longhorn_teardown.py",
        '"pulumi refresh --run-program --clear-pending-creates --yes --stack <env>"',
    ),
    "scripts/stack.sh up --stack <env> --yes": RunBy(
        "tests/lab/test_longhorn_teardown.py", '"scripts/stack.sh up --stack <env> --yes"'
    ),
    # docs/teardown.md: read from the page and typed, in test_the_readme_teardown_with_longhorn.
    "pulumi destroy --run-program --preview-only --stack <env>": RunBy(
        "tests/lab/test_longhorn_teardown.py", '"pulumi destroy --run-program --preview-only --stack <env>"'
    ),
    "pulumi destroy --run-program --yes --stack <env>": RunBy(
        "tests/lab/test_longhorn_teardown.py", '"pulumi destroy --run-program --yes --stack <env>"'
    ),
    # docs/teardown.md: read from the page and typed, in test_a_lost_control_plane_is_torn_down_with_its_loss_declared.
    "pulumi up --yes --stack <env>": RunBy(
        "tests/lab/test_longhorn_teardown.py", 'docs_commands("teardown.md", "When the control plane is lost")'
    ),
    # docs/teardown.md: read from the page and typed, in test_the_documented_stack_rm_keeps_the_stack_file.
    "pulumi stack rm --preserve-config --yes --stack <env>": RunBy(
        "tests/lab/test_longhorn_teardown.py", 'docs_commands("teardown.md", "Removing the stack")'
    ),
    # README.md and docs/getting-started-hetzner.md: the first-run block, typed at a pseudo-terminal.
    "scripts/stack.sh preview": RunBy("tests/lab/test_stack_preview.py", 'first_run_block(REPO / "README.md")'),
    # README.md and docs/lab.md: the demo, run as a newcomer runs it.
    "bash scripts/demo.sh up": RunBy("tests/lab/test_demo.py", '_demo("up", demo_dir)'),
    "bash scripts/demo.sh down": RunBy("tests/lab/test_demo.py", '_demo("down", demo_dir)'),
    # README.md and docs/lab.md: the test command is what CI runs, and it sets the lab up.
    "bash scripts/test.sh": RunBy(".ci/run", "exec bash scripts/test.sh"),
    "bash lab/setup.sh": RunBy("scripts/test.sh", "bash lab/setup.sh"),
}
