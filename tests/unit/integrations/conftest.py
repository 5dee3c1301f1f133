"""A call's record for the integrations' unit tests, which check what a model or an MCP client
is told of a call in each state."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dex_celery import EffectClass, Settings, ToolPolicy
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import resolve_policy
from dex_celery.model.records import ToolCallRecord

#: The call's key (`session/turn/call`) and when it was requested (Unix seconds).
KEY = "s/t/c"
REQUESTED_AT = 1_800_000_000.0

RecordOf = Callable[..., ToolCallRecord]


def _record_of(
    status: CallStatus, error: str | None = None, *, deadline: float | None = None
) -> ToolCallRecord:
    """A `charge` (a non-idempotent write that asks a person) in `status`: requested at
    `REQUESTED_AT`, ended five seconds later when `status` is terminal, its approval deadline
    `deadline` (ten minutes after the request by default) while it awaits one."""
    policy = resolve_policy(
        ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=True),
        None,
        None,
        Settings(),
    )
    ended = status.terminal
    waits = status is CallStatus.AWAITING_APPROVAL
    session, turn, call = KEY.split("/")
    return ToolCallRecord(
        key=KEY,
        session_id=session,
        turn_id=turn,
        tool_call_id=call,
        tool_name="charge",
        arguments="{}",
        policy=policy,
        status=status,
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
