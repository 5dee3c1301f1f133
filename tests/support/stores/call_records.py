"""A call record as the store hands it out, for the unit tests that judge, show or report one
without a store: the call `s/t/c` of the tool `charge`, a write, pending; a test names what it
changes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.model.records import ToolCallRecord
from dex_celery.settings import Settings


def call_record(
    status: CallStatus = CallStatus.PENDING,
    *,
    effect: EffectClass = EffectClass.NON_IDEMPOTENT_WRITE,
    requires_approval: bool | None = None,
    **changes: Any,
) -> ToolCallRecord:
    """The record, its policy resolved from `effect` with the default settings."""
    policy = resolve_policy(
        ToolPolicy(effect=effect, requires_approval=requires_approval), None, None, Settings()
    )
    record = ToolCallRecord(
        key="s/t/c",
        session_id="s",
        turn_id="t",
        tool_call_id="c",
        tool_name="charge",
        arguments="{}",
        policy=policy,
        status=status,
        error=None,
        result=None,
        attempts=0,
        requested_at=1.0,
        finished_at=None,
    )
    return replace(record, **changes)
