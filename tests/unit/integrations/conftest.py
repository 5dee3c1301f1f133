"""A call's record for the integrations' unit tests, which check what a model or an MCP client
is told of a call in each state."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from tests.support.stores.call_records import call_record

#: When the call (`s/t/c`, `call_record`'s) was requested (Unix seconds).
REQUESTED_AT = 1_800_000_000.0

RecordOf = Callable[..., ToolCallRecord]


def _record_of(
    status: CallStatus, error: str | None = None, *, deadline: float | None = None
) -> ToolCallRecord:
    """A `charge` (a non-idempotent write that asks a person) in `status`: requested at
    `REQUESTED_AT`, ended five seconds later when `status` is terminal, its approval deadline
    `deadline` (ten minutes after the request by default) while it awaits one."""
    ended = status.terminal
    waits = status is CallStatus.AWAITING_APPROVAL
    return call_record(
        status,
        requires_approval=True,
        error=error,
        result='"ok"' if status is CallStatus.SUCCEEDED else None,
        attempts=1 if ended else 0,
        requested_at=REQUESTED_AT,
        finished_at=REQUESTED_AT + 5 if ended else None,
        approval_deadline=(deadline or REQUESTED_AT + 600) if waits else None,
    )


@pytest.fixture
def record_of() -> RecordOf:
    """`_record_of`: a record of a call in the state a test names."""
    return _record_of
