"""The types of event dex-celery writes to the ledger's stream; every writer names them here."""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    """Every event type dex-celery writes."""

    TOOL_CALL_REQUESTED = "tool_call_requested"
    TOOL_CALL_AWAITING_APPROVAL = "tool_call_awaiting_approval"
    TOOL_CALL_DECIDED = "tool_call_decided"
    TOOL_CALL_STARTED = "tool_call_started"
    #: The ledger decided the call's outcome (`status`) at the end of a worker's attempt; its
    #: SQL record follows in the worker's recorder's next batch, then `tool_call_finished`.
    #: A waiting caller learns the outcome from it without waiting for that batch.
    TOOL_CALL_ENDED = "tool_call_ended"
    TOOL_CALL_FINISHED = "tool_call_finished"
    TOOL_CALL_LATE_RESULT = "tool_call_late_result"
    #: The reconcile beat job saw an `outcome_unknown` call for the first time (S8.4).
    TOOL_CALL_OUTCOME_UNKNOWN_SURFACED = "tool_call_outcome_unknown_surfaced"
    #: The reconcile beat job sent the real outcome of an unknown call to its session (S8.1).
    TOOL_CALL_OUTCOME_REPORTED = "tool_call_outcome_reported"
    #: The repeat guard held a call back (S5.4): an identical earlier call may still be running
    #: or may have taken effect. Carries the earlier call's key and the reason.
    TOOL_CALL_REPEAT_HELD = "tool_call_repeat_held"
    #: New evidence about the earlier call a held-back call repeats (its late result arrived, or
    #: it was reconciled), published on the held-back call's key for its approver (S5.4).
    TOOL_CALL_REPEAT_EVIDENCE = "tool_call_repeat_evidence"
    #: An MCP tool's definition (schema, annotations, description) differs from the one a
    #: person accepted: its calls wait for approval until someone accepts the new one. Not about
    #: a call (empty key); carries `server`, `tool`, `digest` and the accepted `pinned` digest.
    MCP_TOOL_DEFINITION_CHANGED = "mcp_tool_definition_changed"
    #: An approver edited a waiting call's arguments when approving it (S13.3); carries `by`.
    #: The record holds the edit (before, after); the model reads it in the TOOL message.
    TOOL_CALL_ARGUMENTS_EDITED = "tool_call_arguments_edited"
    #: A claim met a write freeze (S13.2): the call's entry left the ledger, to be held for a
    #: person or rejected. Written by `claim.lua`; carries `attempt` and the `freeze` id.
    TOOL_CALL_FROZEN = "tool_call_frozen"
    #: An operator froze writes (S13.2). Not about a call (empty key); carries `freeze` (id),
    #: `tool` (a name or `*`), `mode`, `by` and `reason`.
    WRITES_FROZEN = "writes_frozen"
    #: An operator thawed a freeze; the same fields, `by` the one who thawed.
    WRITES_THAWED = "writes_thawed"
