"""What a fresh Pulumi Python process of this program costs in CPU before it does any work.

    venv/bin/python -m bench.startup --out bench/results/startup.json
    venv/bin/python -m bench.startup --runs 3

Every `pulumi up/preview/destroy` starts one dynamic provider process (`python -m
pulumi.dynamic`) per provider shard, and one program process (`__main__.py` under the language
host). Most of them only answer Check/Diff, so what they import at start-up is most of what they
cost. Two kinds of fresh interpreter are measured, each `--runs` times, as user+sys CPU-seconds
of the child (`resource.getrusage(RUSAGE_CHILDREN)` before and after):

* a provider process, once per provider class: the modules `pulumi.dynamic`'s `__main__` imports
  (dill, grpc, pulumi.runtime, the provider protocol), then the provider class unpickled with
  dill, as the engine's provider process does with the pickled provider it is sent (dill pickles
  the class by reference, `providers.<module>.<Class>`, so unpickling imports that module);
* a program process: what `__main__.py` imports (`pulumi`, `cluster_settings`,
  `components.program`);
* an operator CLI process: what every `scripts/hk3s` line imports before it does anything
  (`operator_cli.cli` and the operator API it drives).

The baseline is the bare interpreter with the `pulumi.dynamic` modules only. Figures are medians
over the runs; the machine is shared, so compare runs made one after the other.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dill

REPO = Path(__file__).resolve().parent.parent

# What `python -m pulumi.dynamic` imports before it reads the provider it is sent.
PROVIDER_HOST_IMPORTS = (
    "import asyncio, base64, dill, grpc\n"
    "from google.protobuf import empty_pb2\n"
    "from pulumi.runtime import configure, proto, rpc, Settings\n"
    "from pulumi.runtime.proto import provider_pb2_grpc, ResourceProviderServicer\n"
    "from pulumi.dynamic import ResourceProvider\n"
)
UNPICKLE = "import sys\ndill.loads(sys.stdin.buffer.read())\n"
PROGRAM_IMPORTS = (
    "import pulumi\n"
    "from cluster_settings import load_settings_from_pulumi\n"
    "from components.program import build_cluster, read_credentials\n"
)

# What `python -m operator_cli` imports before it reads its arguments.
OPERATOR_CLI_IMPORTS = "import operator_cli.cli, operator_api\n"


def child_cpu(code: str, stdin: bytes = b"") -> float:
    """User+sys CPU-seconds of one fresh interpreter running `code` in the repository."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], input=stdin, cwd=REPO, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_cpu(code: str, runs: int, stdin: bytes = b"") -> float:
    return round(statistics.median(child_cpu(code, stdin) for _ in range(runs)), 3)


def provider_classes() -> list[type]:
    import providers  # noqa: PLC0415 - the parent only, to pickle each class by reference

    return list(providers.ALL_PROVIDERS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="fresh interpreters per figure (median)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--label", default="", help="a note stored with the figures (e.g. before/after)")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    baseline = median_cpu(PROVIDER_HOST_IMPORTS, args.runs)
    per_provider: dict[str, float] = {}
    for provider_class in provider_classes():
        blob = dill.dumps(provider_class)
        per_provider[f"{provider_class.__module__}.{provider_class.__qualname__}"] = median_cpu(
            PROVIDER_HOST_IMPORTS + UNPICKLE, args.runs, blob
        )
    program = median_cpu(PROGRAM_IMPORTS, args.runs)
    operator_cli = median_cpu(OPERATOR_CLI_IMPORTS, args.runs)
    provider_median = round(statistics.median(per_provider.values()), 3)

    print(f"{'process':<62} {'CPU-s (median of ' + str(args.runs) + ')':>22}")
    print(f"{'pulumi.dynamic modules only (baseline)':<62} {baseline:>22.3f}")
    for name, cpu in per_provider.items():
        print(f"{'provider ' + name:<62} {cpu:>22.3f}")
    print(f"{'provider process, median over the classes':<62} {provider_median:>22.3f}")
    print(f"{'program (__main__.py imports)':<62} {program:>22.3f}")
    print(f"{'operator CLI (scripts/hk3s imports)':<62} {operator_cli:>22.3f}")

    if args.out:
        result: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "label": args.label,
            "runs": args.runs,
            "python": sys.version.split()[0],
            "cpu_seconds": {
                "baseline_pulumi_dynamic": baseline,
                "provider_process_median": provider_median,
                "provider_process": per_provider,
                "program": program,
                "operator_cli": operator_cli,
            },
        }
        existing = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps([*existing, result], indent=2) + "\n")


if __name__ == "__main__":
    main()
