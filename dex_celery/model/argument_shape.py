"""The shape tool arguments may have beyond being a JSON object (S9.3): how deep they nest, and
text that is Unicode.

JSON allows any depth, but every encoder, decoder and walker of arguments (the canonical JSON,
call identity, redaction, the worker's decoding) recurses, so a value nested deeper than
Python's recursion limit raised `RecursionError` from wherever it got first. A lone surrogate
(`"\\udc80"`, which JSON's `\\u` escapes and Python strings allow) is no Unicode text: no
database, broker or log can store it. Both are refused up front with the typed error every
other bad argument gets, before anything is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: How deep lists and objects may nest inside a call's arguments (the object itself is 1).
MAX_ARGUMENT_DEPTH = 64


def too_deep(value: Any, limit: int = MAX_ARGUMENT_DEPTH) -> bool:
    """Whether lists, tuples and mappings nest deeper than `limit` in `value` (walked without
    recursion, so any depth is measured)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds a lone surrogate (it cannot be UTF-8), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None
