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
"""

from __future__ import annotations

from enum import StrEnum

from dex_celery.model.outcomes import DID_NOT_RUN, CallStatus

#: The `_meta` key of the outcome field (docs/mcp.md).
OUTCOME_META_KEY = "dex-celery/outcome"
#: The `_meta` key of the call's dex status (`awaiting_approval` ... `outcome_unknown`), or
#: `refused` / `in_flight` for a request that recorded no call / may have.
STATUS_META_KEY = "dex-celery/status"


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
