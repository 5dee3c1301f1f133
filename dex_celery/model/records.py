"""The values the client hands out: call records, messages, snapshots (S7).

Frozen dataclasses: a record is what the system of record said when it was read, never a live
object that changes under the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from dex_celery.model.approval_binding import ApprovalEdit
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass, PolicySnapshot


class MessageRole(StrEnum):
    """Who a message in the session's history is from; `TOOL` messages report calls."""

    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of a session's history (S7.2)."""

    role: MessageRole
    text: str | None = None
    tool_output: str | None = None
    turn_id: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    tool_arguments: str | None = None
    id: int = 0
    created_at: float = 0.0
    #: Copied from an agent framework's own history (a user or assistant message that led to a
    #: call), not written through dex; such messages are never handed back to the framework.
    mirrored: bool = False


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    decision: str  # "approved" | "rejected" | "expired"
    decided_by: str
    decided_at: float
    note: str | None


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call as recorded in SQL, with the policy that applied when it was requested."""

    key: str
    session_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    arguments: str
    policy: PolicySnapshot
    status: CallStatus
    error: str | None
    result: str | None
    attempts: int
    requested_at: float
    finished_at: float | None
    approval_deadline: float | None = None
    approval: ApprovalDecision | None = None
    late_result: str | None = None
    attempt_log: str | None = None
    ledger_epoch: str | None = None
    #: The write fence: who claimed this write's attempt in the system of record, and when.
    claimed_by: str | None = None
    claimed_at: float | None = None
    #: The secret argument values, sealed; `arguments` shows them as `***` (docs/secrets.md).
    sealed_arguments: str | None = field(default=None, repr=False)
    #: Held back by the repeat guard (S5.4): the identical earlier call and why this one waits.
    repeat_of: str | None = None
    repeat_reason: str | None = None
    #: Digest of tool and canonical arguments of a guarded call (`tools/repeat_digest.py`).
    repeat_digest: str | None = field(default=None, repr=False)
    #: The request's trace context (JSON of the propagator's headers, `engine/tracing.py`), so
    #: retries and records made later by another process join the request's trace.
    trace_context: str | None = field(default=None, repr=False)
    #: The write budgets it drew on, as fixed at its request (S13.1, `model/budgets.py`, JSON
    #: of its charges); None: none.
    budgets: str | None = None
    #: Why it waits for a person (or was rejected): a budget had too little left (S13.1).
    budget_reason: str | None = None
    #: What an approval is bound to (S13.3, `tools/definition_digest.py`): set for calls that
    #: waited for a person. The digests of the validated arguments and of the tool's
    #: definition, the binding an approval holds, and when the worker's claim consumed it.
    arguments_digest: str | None = field(default=None, repr=False)
    definition_digest: str | None = field(default=None, repr=False)
    approved_digest: str | None = field(default=None, repr=False)
    approval_used_at: float | None = None
    #: An approver's edit of the arguments (who, when, before, after; secrets `***`).
    approval_edit: ApprovalEdit | None = None
    #: Why an approved call waits for a person again (its tool changed before it ran).
    rewait_reason: str | None = None
    #: What the tool's preview function said of the call while it waited for approval, or
    #: "preview unavailable: ..." (docs/guardrails.md, "Previews"); None until a worker ran it.
    preview: str | None = None

    @property
    def effect(self) -> EffectClass:
        return self.policy.effect

    @property
    def finished(self) -> bool:
        return self.status.terminal


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    """A session's calls and history as of one read (S7.1)."""

    session_id: str
    tool_calls: tuple[ToolCallRecord, ...] = field(default_factory=tuple)
    messages: tuple[Message, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: str
    default_effect: EffectClass | None
    created_at: float
