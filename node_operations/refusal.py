"""Refusals: the program stopped on purpose before changing anything, and says why.

Each refusal's message carries a code in a fixed form, `[refused: <code>]`, so whoever
reads the engine's report (the operator API, operator_api.events) classifies the failure
by that code instead of by matching the wording of the message, which may change. The
codes are the `reason` of the operator API's `RefusedError`.
"""

from __future__ import annotations

import re
from typing import Literal

from .doc_links import REFUSAL_PAGES, with_docs_link

RefusalCode = Literal["capability-missing", "preflight", "settings", "host-key", "teardown", "removal", "fence"]
REFUSAL_CODES: tuple[RefusalCode, ...] = (
    "capability-missing",
    "preflight",
    "settings",
    "host-key",
    "teardown",
    "removal",
    "fence",
)
_TAG = re.compile(r"\s*\[refused: (?P<code>[a-z-]+)\]")


def refusal_tag(code: RefusalCode) -> str:
    """The mark a refusal's message ends with."""
    return f"[refused: {code}]"


def tagged(message: str, code: RefusalCode, *, docs: str = "") -> str:
    """`message` marked as a refusal with `code` (on a line of its own after a message of
    several lines, so the last line of such a message keeps its own meaning), after the docs
    page that explains it: `docs`, or the page for `code` (node_operations.doc_links), so the
    reader finds the rules behind the refusal without knowing where they are written."""
    text = with_docs_link(message, docs or REFUSAL_PAGES[code])
    return f"{text}{chr(10) if chr(10) in text else ' '}{refusal_tag(code)}"


def refusal_code(text: str) -> RefusalCode | None:
    """The refusal code `text` carries, or None when it is no refusal."""
    match = _TAG.search(text)
    if match is None:
        return None
    code = match["code"]
    for known in REFUSAL_CODES:
        if code == known:
            return known
    return None


def untagged(text: str) -> str:
    """`text` without its refusal mark."""
    return _TAG.sub("", text)
