"""The outcome field of every `dex-celery mcp` answer: did the tool run, or may it have?

MCP results say `isError`, which cannot tell "the tool did not run, so calling again is safe"
from "the tool may have taken effect, do not call again". dex-celery's records can, so every
answer (a `tools/call` result, a task of the tasks extension, a refusal) carries
`_meta["dex-celery/outcome"]` beside the call's idempotency key (`dex-celery/idempotency-key`),
the extension dex-celery proposes to MCP clients (docs/mcp.md):

| the record                                        | `dex-celery/outcome` |
|---------------------------------------------------|----------------------|
| `succeeded`                                       | `executed`           |
| `failed` whose error is the did-not-run sentence  | `not_executed`       |
| `failed` otherwise (the tool ran and failed)      | `executed`           |
| `rejected`                                        | `not_executed`       |
| `outcome_unknown`                                 | `unknown`            |
| `awaiting_approval`, `pending`                    | `pending`            |

A request refused before anything was recorded answers `not_executed`; one whose recording
is itself in doubt (`in_flight`) answers `pending`: asking again the same way follows it.

The field is published as an experimental MCP extension, `dex-celery/outcome`
(docs/mcp-outcome-extension.md): a server advertises it under `capabilities.extensions`, a client
declares it and sends an idempotency key, and a re-sent key is the same call. `dex-celery mcp`
advertises it; dex-celery's MCP client (`mcp/client`) reads it from any server that does.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from dex_celery.model.outcomes import DID_NOT_RUN, CallStatus

#: The `_meta` key of the outcome field (docs/mcp.md).
OUTCOME_META_KEY = "dex-celery/outcome"
#: The `_meta` key of the call's dex status (`awaiting_approval` ... `outcome_unknown`), or
#: `refused` / `in_flight` for a request that recorded no call / may have.
STATUS_META_KEY = "dex-celery/status"
#: The extension's identifier, under `capabilities.extensions` of both sides (SEP-2133 form).
OUTCOME_EXTENSION = "dex-celery/outcome"
#: The revision of docs/mcp-outcome-extension.md a server implements (its settings' `version`).
OUTCOME_EXTENSION_VERSION = "2026-12-06"


class Outcome(StrEnum):
    """What an MCP client may conclude about the tool's effect from one answer."""

    #: The tool ran (it succeeded, or it ran and failed): calling again would run it again.
    EXECUTED = "executed"
    #: The tool did not run and never will under this key: calling again is safe.
    NOT_EXECUTED = "not_executed"
    #: The tool may or may not have taken effect: check before calling again (S4.5).
    UNKNOWN = "unknown"
    #: No outcome yet (waiting for a person, queued or running): follow the same call.
    PENDING = "pending"


def outcome_of(status: CallStatus, error: str | None) -> Outcome:
    """The outcome field of a call in `status` whose error text is `error` (S4.2, S4.5)."""
    if status is CallStatus.SUCCEEDED:
        return Outcome.EXECUTED
    if status is CallStatus.REJECTED:
        return Outcome.NOT_EXECUTED
    if status is CallStatus.OUTCOME_UNKNOWN:
        return Outcome.UNKNOWN
    if status is CallStatus.FAILED:
        did_not_run = (error or "").startswith(DID_NOT_RUN)
        return Outcome.NOT_EXECUTED if did_not_run else Outcome.EXECUTED
    return Outcome.PENDING


def extension_settings() -> dict[str, Any]:
    """What a server advertises under `capabilities.extensions["dex-celery/outcome"]`."""
    return {
        "version": OUTCOME_EXTENSION_VERSION,
        "outcomes": [o.value for o in Outcome],
        "idempotencyKeyMeta": "dex-celery/idempotency-key",
    }


def outcome_in(meta: Mapping[str, Any] | None) -> Outcome | None:
    """The outcome a result's, task's or error's `_meta` (or error `data`) states, or None if it
    states none or a value this revision does not know (the client's fallback rules apply)."""
    value = (meta or {}).get(OUTCOME_META_KEY)
    try:
        return Outcome(value) if isinstance(value, str) else None
    except ValueError:
        return None


def advertised(extensions: Mapping[str, Any] | None) -> bool:
    """True if a server's `capabilities.extensions` advertise this extension."""
    return isinstance(extensions, Mapping) and OUTCOME_EXTENSION in extensions
