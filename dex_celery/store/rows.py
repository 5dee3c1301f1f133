"""SQL rows to the frozen records the rest of dex-celery reads (`dex_celery.model.records`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import RowMapping

from dex_celery.model.approval_binding import ApprovalEdit, edited_note, with_note
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus, tool_output
from dex_celery.model.policy import EffectClass, PolicySnapshot
from dex_celery.model.records import (
    ApprovalDecision,
    Message,
    MessageRole,
    SessionRecord,
    ToolCallRecord,
)
from dex_celery.store.values import Outcome


def session_record(row: RowMapping) -> SessionRecord:
    effect = row["default_effect"]
    return SessionRecord(
        id=row["id"],
        default_effect=EffectClass.parse(effect) if effect else None,
        created_at=row["created_at"],
    )


def call_record(row: RowMapping | dict[str, Any]) -> ToolCallRecord:
    decision = None
    if row.get("decision"):
        decision = ApprovalDecision(
            decision=row["decision"],
            decided_by=row["decided_by"] or "",
            decided_at=row["decided_at"] or 0.0,
            note=row.get("decision_note"),
        )
    return ToolCallRecord(
        key=row["key"],
        session_id=row["session_id"],
        turn_id=row["turn_id"],
        tool_call_id=row["tool_call_id"],
        tool_name=row["tool_name"],
        arguments=row["arguments"],
        policy=PolicySnapshot.from_json(row["policy"]),
        status=CallStatus(row["status"]),
        error=row.get("error"),
        result=row.get("result"),
        attempts=row.get("attempts") or 0,
        requested_at=row["requested_at"],
        finished_at=row.get("finished_at"),
        approval_deadline=row.get("approval_deadline"),
        approval=decision,
        late_result=row.get("late_result"),
        attempt_log=row.get("attempt_log"),
        ledger_epoch=row.get("ledger_epoch"),
        sealed_arguments=row.get("sealed_arguments"),
        claimed_by=row.get("claimed_by"),
        claimed_at=row.get("claimed_at"),
        repeat_of=row.get("repeat_of"),
        repeat_reason=row.get("repeat_reason"),
        repeat_digest=row.get("repeat_digest"),
        trace_context=row.get("trace_context"),
        budgets=row.get("budgets"),
        budget_reason=row.get("budget_reason"),
        arguments_digest=row.get("arguments_digest"),
        definition_digest=row.get("definition_digest"),
        approved_digest=row.get("approved_digest"),
        approval_used_at=row.get("approval_used_at"),
        approval_edit=ApprovalEdit.from_json(row.get("approval_edit")),
        rewait_reason=row.get("rewait_reason"),
        preview=row.get("preview"),
    )


def message_record(row: RowMapping) -> Message:
    return Message(
        role=MessageRole(row["role"]),
        text=row["text"],
        tool_output=row["tool_output"],
        turn_id=row["turn_id"],
        tool_call_id=row["tool_call_id"],
        tool_name=row["tool_name"],
        tool_arguments=row["tool_arguments"],
        id=row["id"],
        created_at=row["created_at"],
        mirrored=row.get("mirror_key") is not None,
    )


def tool_message_row(
    key: CallKey,
    tool_name: str,
    arguments: str,
    outcome: Outcome,
    now: float,
    edit: str | None = None,
) -> dict[str, Any]:
    """The TOOL message of an ended call: what the model reads of its outcome (S7.1).

    Built here only, for the single and the batched outcome writes alike. `edit`: the call's
    `approval_edit` (JSON), when a person edited its arguments: the model reads so (S13.3).
    """
    note = edited_note(ApprovalEdit.from_json(edit), outcome.status) if edit else None
    return {
        "session_id": key.session_id,
        "role": MessageRole.TOOL.value,
        "text": None,
        "tool_output": with_note(note, tool_output(outcome.status, outcome.result, outcome.error)),
        "turn_id": key.turn_id,
        "tool_call_id": key.tool_call_id,
        "tool_name": tool_name,
        "tool_arguments": arguments,
        "call_key": key.key,
        "created_at": now,
    }


def approval_values(decision: ApprovalDecision, epoch: str | None) -> dict[str, Any]:
    """The columns an approval sets on its call: pending again, who decided, when and why, and
    the ledger life it is about to be opened in (`epoch`, when known)."""
    values: dict[str, Any] = dict(
        status=CallStatus.PENDING.value,
        decision=decision.decision,
        decided_by=decision.decided_by,
        decided_at=decision.decided_at,
        decision_note=decision.note,
    )
    if epoch is not None:
        values["ledger_epoch"] = epoch
    return values
