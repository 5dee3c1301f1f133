"""Keeping secret argument values out of Flower and logs (S9.2), and the one rule for what a
record's arguments look like to a person (`shown_arguments`).

Every output that shows a call's arguments (the CLI's `calls show` and `approvals list`, the web
app's pages, webhook bodies, the client's pending-approval listing) calls `shown_arguments`, so
they all hide the same things: the values of the policy's `secret_arguments` and of any argument
named in `ALWAYS_SECRET`, at any depth. The stored arguments already carry `***` for the
policy's names (they are sealed, `dex_celery/tools/sealing.py`); redacting again here also covers an
argument named `secret` the policy forgot, and nested keys of those names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dex_celery.model.records import ToolCallRecord

REDACTED = "***"

#: Argument names hidden in every output whatever a tool's policy says (S10.4: the value of an
#: argument named secret appears in no output), at any depth of the arguments.
ALWAYS_SECRET: tuple[str, ...] = ("secret",)


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


def shown_arguments(
    arguments: str | Mapping[str, Any], secret_arguments: Iterable[str]
) -> dict[str, Any]:
    """What a call's arguments look like to a person, in every output (the one display rule).

    `arguments`: the stored JSON text (or an object); `secret_arguments`: the policy's names.
    The values of those names and of `ALWAYS_SECRET` are `***` at any depth. Stored arguments
    are canonical JSON objects; anything else (never expected) shows as `{}` rather than as
    text nobody checked.
    """
    if isinstance(arguments, str):
        try:
            value: Any = json.loads(arguments)
        except ValueError:
            return {}
    else:
        value = arguments
    if not isinstance(value, Mapping):
        return {}
    return redact(value, (*secret_arguments, *ALWAYS_SECRET))


def record_arguments(record: ToolCallRecord) -> dict[str, Any]:
    """`shown_arguments` of a call's record, under its own policy snapshot."""
    return shown_arguments(record.arguments, record.policy.secret_arguments)


def redacted_kwargs_repr(kwargs: Mapping[str, Any], secrets: Iterable[str]) -> str:
    """What Flower shows as the task's kwargs: the key is visible, secrets are not."""
    shown = dict(kwargs)
    arguments = shown.get("arguments")
    if isinstance(arguments, Mapping):
        shown["arguments"] = redact(arguments, (*secrets, *ALWAYS_SECRET))
    elif isinstance(arguments, str) and any(f'"{n}"' in arguments for n in ALWAYS_SECRET):
        # The message's JSON text has the policy's names as `***` already; an argument named
        # in ALWAYS_SECRET is parsed only when the text has it (the common path stays cheap).
        shown["arguments"] = json.dumps(shown_arguments(arguments, secrets), sort_keys=True)
    return repr(shown)
