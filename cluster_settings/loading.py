"""Turn raw stack configuration into one validated `StackSettings`, or one error
that lists every problem by config key."""

from __future__ import annotations

import difflib
import json
import typing
from collections.abc import Mapping
from typing import Any

from pulumi.errors import RunError
from pulumi.runtime import config as runtime_config
from pydantic import BaseModel, ValidationError

from node_operations.doc_links import settings_links
from node_operations.refusal import tagged

from .models import StackSettings
from .rules import NAMESPACE, SettingProblem, check_stack_rules

# The top-level keys of the `hk3s` config namespace.
TOP_LEVEL_KEYS = tuple(StackSettings.model_fields)


class SettingsError(ValueError, RunError):
    """The stack configuration is invalid; nothing has been changed.

    A `RunError` too: Pulumi's Python language host reports a RunError raised by the program
    as its message alone (the message lists every problem by key), any other exception with
    a traceback."""

    def __init__(self, problems: list[SettingProblem]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(
            tagged(
                f"The stack configuration has {len(problems)} problem(s); nothing was changed:\n{lines}",
                "settings",
                docs=settings_links(problem.key for problem in problems),
            )
        )


def _union_tags() -> set[str]:
    return {"hetzner", "existing"}


def _field_names_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Known field names of the model that `loc` (minus its last element) points into."""
    current: Any = model
    skip_next = False  # the element after a list or dict field is an index or a key
    for part in loc[:-1]:
        if skip_next or isinstance(part, int):
            skip_next = False
            continue
        if isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            annotation = current.model_fields[part].annotation
            origin = typing.get_origin(annotation)
            skip_next = origin in (list, dict)
            args = typing.get_args(annotation)
            nested = [arg for arg in (annotation, *args) if isinstance(arg, type) and issubclass(arg, BaseModel)]
            current = nested[0] if nested else None
        elif part not in _union_tags():
            current = None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _config_key(loc: tuple[Any, ...]) -> str:
    text = NAMESPACE + ":"
    first = True
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in _union_tags() and not first:
            continue
        else:
            text += ("" if first else ".") + str(part)
        first = False
    return text


def _problem_from_error(error: Mapping[str, Any]) -> SettingProblem:
    loc = tuple(error["loc"])
    key = _config_key(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        known = _field_names_at(StackSettings, loc)
        guess = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        return SettingProblem(key, f"is not a setting; {hint}known settings here: {', '.join(known)}")
    if kind == "missing":
        return SettingProblem(key, "is required; set it in the stack's Pulumi.<stack>.yaml (see docs/configuration.md)")
    message = str(error["msg"])
    message = message.removeprefix("Value error, ")
    if "input" in error and kind not in ("value_error",):
        message += f" (got {error['input']!r})"
    return SettingProblem(key, message)


def load_settings(raw: Mapping[str, Any]) -> StackSettings:
    """Validate raw config (the `hk3s` namespace as a dict of top-level keys).

    Raises `SettingsError` listing every problem with its config key.
    """
    unknown = [key for key in raw if key not in TOP_LEVEL_KEYS]
    problems = [
        SettingProblem(
            f"{NAMESPACE}:{key}",
            "is not a setting of this program; known: " + ", ".join(TOP_LEVEL_KEYS),
        )
        for key in unknown
    ]
    try:
        settings = StackSettings.model_validate({k: v for k, v in raw.items() if k not in unknown})
    except ValidationError as error:
        problems.extend(_problem_from_error(item) for item in error.errors())
        raise SettingsError(problems) from None
    problems.extend(check_stack_rules(settings))
    if problems:
        raise SettingsError(problems)
    return settings


def load_settings_from_pulumi() -> StackSettings:
    """Read every `hk3s:*` key of the current stack's config and validate it.

    All keys are read, not only the known ones, so a misspelt top-level key is
    reported instead of silently ignored.
    """
    merged: dict[str, Any] = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw: dict[str, Any] = {}
    for full_key, value in merged.items():
        namespace, _, key = full_key.partition(":")
        if namespace != NAMESPACE:
            continue
        try:
            raw[key] = json.loads(value) if isinstance(value, str) else value
        except json.JSONDecodeError:
            raw[key] = value
    return load_settings(raw)
