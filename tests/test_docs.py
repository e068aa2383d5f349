"""Every fenced block of the documentation is checked as written: README.md, docs/*.md and
bench/README.md.

The rules (docs/lab.md, "The documentation's own test", says them for writers):

* Every block names its language: `bash`, `yaml`, `python` or `text`.
* `yaml`: a stack configuration. A block whose first line is `# fragment: hk3s:<key>` is the
  value of that one key: it is put into the example dev stack (Pulumi.dev.yaml; a mapping is
  merged over the stack's value of the key, anything else replaces it) and the whole config must
  pass the program's own settings models and rules (`cluster_settings.load_settings`). Any other
  yaml block is a whole stack file (`config:` with `hk3s:*` keys, or the keys alone) and must pass
  on its own. In both, `hk3s:ssh.private_key_file` is pointed at a throw-away key, since the
  docs' path names the reader's key.
* `bash`: each command line (comments dropped, `\\` continuations joined, leading `VAR=value`
  and `sudo` dropped; an `export NAME=value ...` line of assignments alone sets the environment
  and is not checked) is an `scripts/hk3s ...` line that the CLI's own parser
  (`operator_cli.cli.build_parser`) accepts, a `venv/bin/python -m <module> ...` line whose
  module exists, or a command listed in tests/lab/doc_commands.py with the file that runs it.
  The list's `pulumi ...` and `scripts/stack.sh ...` commands must be run by a lab test, and
  every listed text must occur in its file.
* `python`: it must compile, and every name it imports must exist.
* `text`: output and synopses. A line `$ scripts/hk3s ...` (a transcript) must parse; a line
  `scripts/hk3s ...` with `[...]` is a synopsis: its subcommands and options must exist.

A deliberately broken block of each kind is fed through the same checker and must fail
(test_a_broken_block_fails).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib
import importlib.util
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster_settings.loading import SettingsError, load_settings
from operator_cli.cli import build_parser
from tests.lab.doc_commands import RUN_BY

REPO = Path(__file__).resolve().parents[1]
LANGUAGES = ("bash", "yaml", "python", "text")
FRAGMENT = re.compile(r"^#\s*fragment:\s*hk3s:(?P<key>[a-z_]+)\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\S*)\s*$")
LAB_ONLY = ("pulumi", "scripts/stack.sh")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]


@dataclass(frozen=True)
class Block:
    where: str  # path:line of the opening fence
    lang: str
    text: str


def blocks_of(text: str, where: str) -> list[Block]:
    """The fenced blocks of a Markdown text, their indentation (a block in a list item) removed."""
    found: list[Block] = []
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent = len(opening["indent"])
        start = index + 1
        body: list[str] = []
        index += 1
        while index < len(lines) and not re.match(r"^\s*```\s*$", lines[index]):
            body.append(lines[index][indent:] if lines[index][:indent].strip() == "" else lines[index])
            index += 1
        if index == len(lines):
            raise AssertionError(f"{where}: a fenced block is never closed")
        found.append(Block(f"{where}:{start}", opening["lang"], "\n".join(body) + "\n"))
        index += 1
    return found


def all_blocks() -> list[Block]:
    result: list[Block] = []
    for path in doc_files():
        text = path.read_text()
        for block in blocks_of(text, str(path.relative_to(REPO))):
            result.append(block)
    return result


# --- the checks: each returns the block's problems, empty when it holds ---


def _example_stack() -> dict[str, Any]:
    config = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith("hk3s:")}


def check_yaml(text: str, key_file: Path) -> list[str]:
    first = text.lstrip().split("\n", 1)[0]
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return [f"not YAML: {error}"]
    fragment = FRAGMENT.match(first)
    if fragment:
        raw = _example_stack()
        key = fragment["key"]
        if isinstance(data, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **data}
        else:
            raw[key] = data
    else:
        if isinstance(data, dict) and "config" in data:
            data = data["config"]
        if not isinstance(data, dict) or not all(str(key).startswith("hk3s:") for key in data):
            return ["a yaml block is a stack's config (hk3s:* keys) or starts with '# fragment: hk3s:<key>'"]
        raw = {str(key).split(":", 1)[1]: value for key, value in data.items()}
    raw = copy.deepcopy(raw)
    ssh = raw.get("ssh")
    if isinstance(ssh, dict) and "private_key_file" in ssh:
        ssh["private_key_file"] = str(key_file)
    try:
        load_settings(raw)
    except SettingsError as error:
        return [f"the settings models refuse it: {error}"]
    return []


def _parse_cli(argv: list[str]) -> str | None:
    """None when the CLI's parser accepts `argv`, else its message."""
    parser = build_parser()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return errors.getvalue().strip().splitlines()[-1] if errors.getvalue().strip() else "refused"
    return None


ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def command_words(line: str) -> list[str]:
    """The words of one command line as the shell splits them, assignments and sudo dropped. An
    `export NAME=value ...` line of assignments only sets the environment of the lines after it
    and runs nothing: it has no words."""
    words = shlex.split(line, comments=True)
    if words[:1] == ["export"] and len(words) > 1 and all(ASSIGNMENT.match(word) for word in words[1:]):
        return []
    while words and (ASSIGNMENT.match(words[0]) or words[0] == "sudo"):
        words = words[1:]
    return words


def check_command(line: str) -> list[str]:
    words = command_words(line)
    if not words:
        return []
    if words[0] == "scripts/hk3s":
        refused = _parse_cli(words[1:])
        return [f"{line!r}: the CLI's parser refuses it: {refused}"] if refused else []
    if words[0] == "venv/bin/python" and len(words) > 2 and words[1] == "-m":
        if importlib.util.find_spec(words[2]) is None:
            return [f"{line!r}: no module {words[2]}"]
        return []
    command = " ".join(words)
    if command not in RUN_BY:
        return [f"{line!r}: no test runs {command!r}: run it in a lab test and list it in tests/lab/doc_commands.py"]
    return []


def command_lines(text: str) -> list[str]:
    return [line for line in text.replace("\\\n", " ").split("\n") if line.strip() and not line.strip().startswith("#")]


def check_bash(text: str) -> list[str]:
    problems: list[str] = []
    for line in command_lines(text):
        problems += check_command(line)
    return problems


def check_python(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        return [f"does not compile: {error}"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            problems += [
                f"{node.module} has no {alias.name}" for alias in node.names if not hasattr(module, alias.name)
            ]
        elif isinstance(node, ast.Import):
            problems += [
                f"no module {alias.name}" for alias in node.names if importlib.util.find_spec(alias.name) is None
            ]
    return problems


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_synopsis(line: str) -> list[str]:
    """A synopsis line `scripts/hk3s [--stack ENV] node add NAME [--opt X]... | other`: each
    subcommand on the path exists and each option is one its parsers take."""
    line = line.split("#", 1)[0]
    head, *alternatives = [part.strip() for part in line.split(" | ")]
    words = head.split()[1:]
    prefix = [word for word in words[: next((i for i, w in enumerate(words) if w[0].islower()), 0)]]
    problems = []
    for form in [words, *[prefix + alternative.split() for alternative in alternatives]]:
        parser = build_parser()
        options = {option for action in parser._actions for option in action.option_strings}
        for written in form:
            word = written.strip("[]").removesuffix("...").strip("[]")
            if word.startswith("--"):
                if word not in options:
                    problems.append(f"{line.strip()!r}: no option {word}")
            elif re.fullmatch(r"[a-z][a-z-]*", word):
                choices = _subparsers(parser)
                if word not in choices:
                    problems.append(f"{line.strip()!r}: no command {word}")
                    break
                parser = choices[word]
                options |= {option for action in parser._actions for option in action.option_strings}
    return problems


def check_text(text: str) -> list[str]:
    problems: list[str] = []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("$ scripts/hk3s "):
            problems += check_command(stripped[2:])
        elif stripped.startswith("scripts/hk3s ") and "[" in stripped:
            problems += check_synopsis(stripped)
    return problems


def check_block(block: Block, key_file: Path) -> list[str]:
    if block.lang not in LANGUAGES:
        return [f"{block.where}: a fenced block names its language, one of {', '.join(LANGUAGES)}"]
    problems = {
        "bash": lambda: check_bash(block.text),
        "yaml": lambda: check_yaml(block.text, key_file),
        "python": lambda: check_python(block.text),
        "text": lambda: check_text(block.text),
    }[block.lang]()
    return [f"{block.where}: {problem}" for problem in problems]


def check_markdown(text: str, where: str, key_file: Path) -> list[str]:
    problems: list[str] = []
    for block in blocks_of(text, where):
        problems += check_block(block, key_file)
    return problems


# --- the tests ---


def test_every_block_of_the_docs_holds(ssh_key_file: Path) -> None:
    problems: list[str] = []
    for path in doc_files():
        problems += check_markdown(path.read_text(), str(path.relative_to(REPO)), ssh_key_file)
    assert problems == [], "\n".join(problems)


def test_the_docs_have_blocks_of_every_kind() -> None:
    """The checker sees the blocks: a parser that found none would pass everything."""
    kinds = {block.lang for block in all_blocks()}
    assert kinds == set(LANGUAGES), kinds
    yaml_blocks = [block for block in all_blocks() if block.lang == "yaml"]
    assert any(FRAGMENT.match(block.text.split("\n", 1)[0]) for block in yaml_blocks)
    lines = [line for block in all_blocks() if block.lang == "bash" for line in command_lines(block.text)]
    assert any(command_words(line)[:1] == ["scripts/hk3s"] for line in lines)
    assert any(" ".join(command_words(line)) in RUN_BY for line in lines)


def _whole_dev_stack(replace: tuple[str, str] = ("", "")) -> str:
    """The example dev stack as one yaml block (optionally with one text replaced)."""
    text = (REPO / "Pulumi.dev.yaml").read_text()
    assert replace[0] in text
    return "```yaml\n" + text.replace(*replace) + "```\n"


# Each broken block, and the words of the problem the checker must report for it.
BROKEN: dict[str, tuple[str, str]] = {
    "an unknown setting": (
        "```yaml\n# fragment: hk3s:cluster\nk3s_versoin: v1.36.1+k3s1\n```\n",
        "hk3s:cluster.k3s_versoin: is not a setting",
    ),
    "a bad value in a whole stack": (
        _whole_dev_stack(("max_copies: 2 ", "max_copies: many ")),
        "hk3s:storage.max_copies",
    ),
    "a pool label the kubelet refuses": (
        "```yaml\n# fragment: hk3s:worker_pools\n- name: batch\n  count: 1\n  labels: {kubernetes.io/role: x}\n```\n",
        "hk3s:worker_pools[0].labels",
    ),
    "a yaml block that is no stack config": (
        "```yaml\nsteps:\n  - run: true\n```\n",
        "a yaml block is a stack's config",
    ),
    "a CLI command that does not exist": (
        "```bash\nscripts/hk3s --stack dev node frobnicate dev-worker-1\n```\n",
        "invalid choice: 'frobnicate'",
    ),
    "a CLI option that does not exist": (
        "```bash\nscripts/hk3s node fence dev-worker-1 --force\n```\n",
        "unrecognized arguments: --force",
    ),
    "a pulumi command no lab test runs": (
        "```bash\npulumi refresh --clear-pending-creates --yes --stack <env>\n```\n",
        "no test runs 'pulumi refresh --clear-pending-creates --yes --stack <env>'",
    ),
    "a stack.sh command no lab test runs": (
        "```bash\nPULUMI_CONFIG_PASSPHRASE=x scripts/stack.sh destroy\n```\n",
        "no test runs 'scripts/stack.sh destroy'",
    ),
    "an export line that also runs a command": (
        "```bash\nexport PULUMI_CONFIG_PASSPHRASE=x scripts/stack.sh destroy\n```\n",
        "no test runs 'export PULUMI_CONFIG_PASSPHRASE=x scripts/stack.sh destroy'",
    ),
    "a module that does not exist": (
        "```bash\nvenv/bin/python -m bench.nothing_here\n```\n",
        "no module bench.nothing_here",
    ),
    "a block with no language": ("```\nscripts/hk3s node list\n```\n", "names its language"),
    "python importing a name the API lacks": (
        "```python\nfrom operator_api import ClusterStak\n```\n",
        "operator_api has no ClusterStak",
    ),
    "a transcript the CLI refuses": ("```text\n$ scripts/hk3s --stack lab node lst\n```\n", "invalid choice: 'lst'"),
    "a synopsis with an option the CLI lacks": (
        "```text\nscripts/hk3s [--stack ENV] node reboot NAME [--now]\n```\n",
        "no option --now",
    ),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_block_fails(name: str, ssh_key_file: Path) -> None:
    """Each kind of mistake, fed through the same checker as the docs, is found and named."""
    block, expected = BROKEN[name]
    problems = check_markdown(block, "broken.md", ssh_key_file)
    assert problems, f"{name}: the checker passed it"
    assert any(expected in problem for problem in problems), problems


def test_the_same_blocks_mended_pass(ssh_key_file: Path) -> None:
    """The broken blocks' mended twins pass, so each failure above is the mistake's, not the form's."""
    mended = (
        "```yaml\n# fragment: hk3s:cluster\nk3s_version: v1.36.1+k3s1\n```\n"
        + _whole_dev_stack()
        + "```yaml\n# fragment: hk3s:worker_pools\n- name: batch\n  count: 1\n  labels: {tier: x}\n```\n"
        "```bash\nexport PULUMI_CONFIG_PASSPHRASE='x' HCLOUD_TOKEN='<your token>'\n"
        "scripts/hk3s --stack dev node fence dev-worker-1 --powered-off\n"
        "pulumi refresh --run-program --clear-pending-creates --yes --stack <env>\n"
        "PULUMI_CONFIG_PASSPHRASE=x scripts/stack.sh preview\nvenv/bin/python -m bench.join --help\n```\n"
        "```text\nscripts/hk3s node list\n```\n"
        "```python\nfrom operator_api import ClusterStack\n```\n"
        "```text\n$ scripts/hk3s --stack lab node list\n"
        "scripts/hk3s [--stack ENV] node reboot NAME [--drain-timeout SECONDS]\n```\n"
    )
    assert check_markdown(mended, "mended.md", ssh_key_file) == []


def test_listed_commands_are_run_where_the_list_says() -> None:
    for command, run_by in RUN_BY.items():
        path = REPO / run_by.path
        assert path.is_file(), f"{command!r}: {run_by.path} does not exist"
        assert run_by.text in path.read_text(), f"{command!r}: {run_by.path} does not contain {run_by.text!r}"
        if command.split()[0] in LAB_ONLY:
            assert run_by.path.startswith("tests/lab/test_"), f"{command!r} must be run by a lab test"


def test_every_listed_command_is_documented() -> None:
    """A command dropped from the docs leaves the list too, so the list says what the docs show."""
    documented = {
        " ".join(command_words(line))
        for block in all_blocks()
        if block.lang == "bash"
        for line in command_lines(block.text)
    }
    assert set(RUN_BY) - documented == set()


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[a-z-]+\.md)[#)]", readme))
    pages = {f"docs/{path.name}" for path in (REPO / "docs").glob("*.md")}
    assert pages - linked == set()
    assert "bench/README.md" in readme
    assert len(readme.splitlines()) <= 250


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped,
    spaces made '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return {github_anchor(match) for match in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def test_every_link_between_the_pages_resolves() -> None:
    problems = []
    for path in doc_files():
        for target, anchor in re.findall(
            r"\]\(((?:\.\./|docs/|bench/|results/)?[\w/.-]*\.(?:md|json))(?:#([\w-]+))?\)", path.read_text()
        ):
            resolved = (path.parent / target).resolve()
            if not resolved.is_file():
                problems.append(f"{path.relative_to(REPO)}: {target} does not exist")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{path.relative_to(REPO)}: {target} has no heading #{anchor}")
        for anchor in re.findall(r"\]\(#([\w-]+)\)", path.read_text()):
            if anchor not in anchors(path):
                problems.append(f"{path.relative_to(REPO)}: no heading #{anchor}")
    assert problems == [], "\n".join(problems)
