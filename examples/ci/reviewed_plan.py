"""The reviewed plan of the example CI workflow (github-actions-deploy.yml), from the JSON of
`scripts/hk3s --json preview`:

    python3 examples/ci/reviewed_plan.py summary PLAN.json       # Markdown for the run's summary
    python3 examples/ci/reviewed_plan.py check REVIEWED.json NOW.json

`check` exits 1, naming what differs, when the plan about to be applied is not the one the
reviewer read: a change added, dropped or of another kind (the code is the same commit, but
the state or the hosts may have moved between the plan job and the approval). The order of
the changes does not count (the engine reports them as its parallel steps finish).
Standard library only: it runs before anything else is installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def changes(path: str) -> set[tuple[str, str]]:
    """The plan's changes as (op, urn) pairs."""
    data = json.loads(Path(path).read_text())
    return {(str(change["op"]), str(change["urn"])) for change in data["changes"]}


def summary(path: str) -> str:
    rows = sorted(changes(path), key=lambda item: (item[1], item[0]))
    lines = ["| op | resource |", "|---|---|"]
    lines += [f"| {op} | `{urn}` |" for op, urn in rows]
    return "\n".join(lines) if rows else "No changes."


def differences(reviewed: str, now: str) -> list[str]:
    before, after = changes(reviewed), changes(now)
    return [f"not reviewed: {op} {urn}" for op, urn in sorted(after - before)] + [
        f"reviewed but no longer planned: {op} {urn}" for op, urn in sorted(before - after)
    ]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "summary":
        print(summary(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "check":
        found = differences(argv[1], argv[2])
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print(
                "the plan differs from the one the reviewer approved: nothing was applied; run the workflow "
                "again and review its new plan",
                file=sys.stderr,
            )
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
