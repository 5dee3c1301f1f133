"""Keeping secret argument values out of Flower and logs (S9.2)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"


def redact(arguments: Mapping[str, Any], secrets: Iterable[str]) -> dict[str, Any]:
    """A copy of `arguments` with the values of the named keys replaced, at any depth."""
    names = frozenset(secrets)

    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: REDACTED if k in names else walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return dict(walk(arguments))


def redacted_kwargs_repr(kwargs: Mapping[str, Any], secrets: Iterable[str]) -> str:
    """What Flower shows as the task's kwargs: the key is visible, secrets are not."""
    shown = dict(kwargs)
    if isinstance(shown.get("arguments"), Mapping):
        shown["arguments"] = redact(shown["arguments"], secrets)
    return repr(shown)
