"""Approvals (S6): people decide the calls that wait for them.

A call whose policy snapshot requires approval is recorded `awaiting_approval` with a deadline
and holds no worker, no Celery message and no ledger entry while it waits (S6.1). A decision is
one conditional update on that status (`WHERE status = 'awaiting_approval' AND deadline > now`),
so when two people decide at once exactly one update matches and the other gets a typed error
(S6.3). Only after its approval is recorded is the call opened in the ledger and published, under
the snapshot taken at request time (S1.5, S6.2). A crash between the two leaves a `pending` call
with no ledger entry, which the sweeper's orphan check opens (same ledger epoch, nothing ran).
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from dex_celery.backend_errors import translating_backend_errors
from dex_celery.engine import tracing
from dex_celery.engine.held_back_evidence import repeat_evidence
from dex_celery.engine.request.approval_edit import edited_arguments
from dex_celery.engine.request.dispatch import GivenArguments
from dex_celery.engine.request.previews import shown_preview
from dex_celery.engine.tracing import span
from dex_celery.errors import (
    AlreadyDecided,
    ApprovalDeadlinePassed,
    ApprovalError,
    InvalidDecision,
    NotAwaitingApproval,
    UnknownCall,
)
from dex_celery.model.argument_shape import lone_surrogate
from dex_celery.model.event_types import EventType
from dex_celery.model.freeze import held_reason
from dex_celery.model.ids import MAX_ID_LENGTH, CallKey, validate_id
from dex_celery.model.list_limits import check_list_limit
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass
from dex_celery.model.records import ApprovalDecision, ToolCallRecord
from dex_celery.model.repeat_rule import RepeatEvidence, held_rejection_note
from dex_celery.model.times import format_utc
from dex_celery.store.approval_binding import ArgumentsEdit
from dex_celery.store.freezes import WriteFreezes
from dex_celery.store.values import Outcome
from dex_celery.tools.definition_digest import binding_digest
from dex_celery.tools.redact import record_arguments
from dex_celery.tools.tool import Tool, find_tool

if TYPE_CHECKING:
    from dex_celery.engine.epoch import LedgerEpoch
    from dex_celery.engine.request.opening import Opener
    from dex_celery.ledger.ledger import Ledger
    from dex_celery.settings import Settings
    from dex_celery.store.repository import Store

log = logging.getLogger("dex_celery.engine.request.approvals")

#: Event type on the AgentEvents stream when a person (or the deadline) decides a call.
#: Most approvals one listing returns unless asked for another limit.
DEFAULT_LIST_LIMIT = 100


class Decision(StrEnum):
    """What was decided; the values are stored in `dex_tool_calls.decision`."""

    APPROVED = "approved"
    REJECTED = "rejected"
    #: The deadline passed first (written by the sweeper or by a late decision).
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """One call waiting for a person, as a listing shows it. Secret arguments are redacted."""

    key: str
    session_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    effect: EffectClass
    requested_at: float
    deadline: float
    #: Held back by the repeat guard (S5.4): the earlier call, why, and what became of it.
    repeat: RepeatEvidence | None = None
    #: Waits because a write budget had too little left (S13.1): why.
    budget_reason: str | None = None
    #: Approved before, but its tool changed before it ran: why it waits again (S13.3).
    waits_again: str | None = None
    #: What the tool's preview function says the call would do (S13.5), "preview pending" or
    #: "preview unavailable: ..."; None for a tool without a preview.
    preview: str | None = None
    #: Held by a write freeze (S13.2): why, who froze writes and since when.
    frozen: str | None = None

    @classmethod
    def of(
        cls,
        record: ToolCallRecord,
        repeat: RepeatEvidence | None = None,
        preview: str | None = None,
        frozen: str | None = None,
    ) -> PendingApproval:
        return cls(
            key=record.key,
            session_id=record.session_id,
            turn_id=record.turn_id,
            tool_call_id=record.tool_call_id,
            tool_name=record.tool_name,
            arguments=record_arguments(record),
            effect=record.effect,
            requested_at=record.requested_at,
            deadline=record.approval_deadline or 0.0,
            repeat=repeat,
            budget_reason=record.budget_reason,
            waits_again=record.rewait_reason,
            preview=preview,
            frozen=frozen,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "effect": self.effect.value,
            "requested_at": self.requested_at,
            "deadline": self.deadline,
            "repeat": self.repeat.as_dict() if self.repeat is not None else None,
            "budget_reason": self.budget_reason,
            "waits_again": self.waits_again,
            "preview": self.preview,
            "frozen": self.frozen,
        }


def _binding(record: ToolCallRecord | None, edit: ArgumentsEdit | None) -> str | None:
    """The binding the approval holds (S13.3); None for a call recorded without digests (before
    they were kept), which is approved unbound, as then."""
    if record is None or record.definition_digest is None:
        return None
    arguments = edit.arguments_digest if edit is not None else record.arguments_digest
    if arguments is None:
        return None
    return binding_digest(arguments, record.definition_digest)


def rejection_error(approver: str, reason: str | None) -> str:
    """The `error` of a call a person rejected; the TOOL message says it was a person."""
    text = f"rejected by {approver}"
    return f"{text}: {reason}" if reason else text


def held_error(record: ToolCallRecord, error: str) -> str:
    """A rejected call the repeat guard held back also tells the model that the earlier call
    may have taken effect (S5.4), never that calling again is safe."""
    if record.repeat_of is None:
        return error
    reason = record.repeat_reason or "it may still be running"
    return f"{error}. {held_rejection_note(record.repeat_of, reason)}"


#: Who decided a call whose approval deadline passed.
APPROVAL_EXPIRED_BY = "system: approval deadline"


def expire_approval(store: Store, ledger: Ledger, record: ToolCallRecord, now: float) -> bool:
    """The approval deadline rule (S6.2): a call still awaiting approval at its deadline ends
    `rejected`, decided by the system. One conditional update, so a person's decision and the
    expiry cannot both win; True if this call ended here.
    """
    error = held_error(
        record,
        "the approval deadline passed before anyone approved the call "
        f"(deadline {format_utc(record.approval_deadline or now, millis=False)})",
    )
    decision = ApprovalDecision("expired", APPROVAL_EXPIRED_BY, now, None)
    done = store.record_outcome(
        record.key,
        Outcome(CallStatus.REJECTED, error),
        from_statuses=(CallStatus.AWAITING_APPROVAL,),
        decision=decision,
    )
    if done:
        ledger.events.publish(
            EventType.TOOL_CALL_DECIDED, record.key, decision="expired", by=APPROVAL_EXPIRED_BY
        )
        ledger.events.publish_finished(record.key, status=CallStatus.REJECTED.value, error=error)
    return done


@translating_backend_errors
class Approvals:
    """Approve, reject and list the calls of one deployment that wait for a decision."""

    def __init__(
        self,
        store: Store,
        ledger: Ledger,
        epoch: LedgerEpoch,
        opener: Opener,
        tools: Mapping[str, Tool],
        settings: Settings,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.epoch = epoch
        self.opener = opener
        self.tools = tools
        self.settings = settings
        self.freezes = WriteFreezes(lambda: store.engine)

    # --- decisions -----------------------------------------------------------------------------

    def approve(
        self,
        key: str,
        approver: str,
        note: str | None = None,
        *,
        edit: GivenArguments | None = None,
    ) -> ToolCallRecord:
        """Approve a waiting call and dispatch it under its recorded policy snapshot (S6.2).

        The approval is bound to the digests of the call's arguments and of its tool's
        definition (S13.3): a worker whose tool changed since claims nothing, and the call waits
        again. `edit`: the arguments the call should run with instead (a JSON object or its
        text; secrets may be given as `***` to keep theirs), checked like a request's and
        recorded with who, before and after (S13.3); the model reads that they were edited.

        Returns the call as recorded after the approval (`pending`, or already further along
        if a worker was quick). Raises `UnknownCall`, `InvalidId`, `InvalidDecision`,
        `InvalidEdit`, `AlreadyDecided`, `NotAwaitingApproval` or `ApprovalDeadlinePassed`; then
        nothing changed, except that a call found past its deadline is ended `rejected` at once.
        """
        key, approver, note = self._check(key, approver, note, "note")
        now = self.store.clock()
        changed = None
        held = self.store.get_call(key)
        if edit is not None:
            if held is None or held.status is not CallStatus.AWAITING_APPROVAL:
                raise self._refusal(key, now)
            tool = find_tool(self.tools, held.tool_name)
            changed = edited_arguments(
                held, tool, edit, by=approver, now=now, settings=self.settings
            )
        decision = ApprovalDecision(Decision.APPROVED.value, approver, now, note)
        epoch = self.epoch.recorded(self.epoch.current(refresh=True))
        if not self.store.approve_bound(
            key,
            decision,
            now=now,
            epoch=epoch,
            binding=_binding(held, changed),
            edit=changed,
            expected_arguments=held.arguments if changed is not None and held else None,
        ):
            raise self._refusal(key, now)
        if changed is not None:
            self._announce_edit(key, approver)
        self._announce(key, Decision.APPROVED, approver, note)
        record = self._get(key)
        if record.repeat_of is not None:
            # The person weighed the earlier call; the next identical request is judged
            # against this one (S5.4).
            self.store.take_repeat_slot(record)
        try:
            # A call a write freeze held may have reached a worker before (S13.2).
            self.opener.start(record, may_have_run=self.freezes.may_have_run(key))
        except Exception:
            # The approval is recorded; the call is pending with no ledger entry, which the
            # sweeper's orphan check opens and publishes. Nothing ran, so nothing is lost.
            log.exception("approved %s but could not dispatch it; the sweeper will", key)
        return self._get(key)

    def reject(self, key: str, approver: str, reason: str | None = None) -> ToolCallRecord:
        """Reject a waiting call: it ends `rejected`, never runs, and the model reads why."""
        key, approver, reason = self._check(key, approver, reason, "reason")
        now = self.store.clock()
        error = rejection_error(approver, reason)
        held = self.store.get_call(key)
        if held is not None:
            error = held_error(held, error)
        decision = ApprovalDecision(Decision.REJECTED.value, approver, now, reason)
        parent = tracing.loads(held.trace_context) if held is not None else None
        with span(tracing.RECORD, parent, key=key, outcome=CallStatus.REJECTED):
            done = self.store.record_outcome(
                key,
                Outcome(CallStatus.REJECTED, error),
                from_statuses=(CallStatus.AWAITING_APPROVAL,),
                decision=decision,
                deadline_after=now,
            )
        if not done:
            raise self._refusal(key, now)
        self._announce(key, Decision.REJECTED, approver, reason, finished_error=error)
        return self._get(key)

    def _announce_edit(self, key: str, approver: str) -> None:
        """`tool_call_arguments_edited` on the events stream (the record holds the edit)."""
        try:
            self.ledger.events.publish(EventType.TOOL_CALL_ARGUMENTS_EDITED, key, by=approver)
        except Exception:
            log.exception("could not announce the edit of %s", key)

    # --- listing -------------------------------------------------------------------------------

    def pending(
        self, session_id: str | None = None, *, limit: int = DEFAULT_LIST_LIMIT
    ) -> list[PendingApproval]:
        """Calls still waiting for a decision (deadline not passed), oldest request first."""
        if session_id is not None:
            validate_id("session id", session_id)
        check_list_limit(limit, InvalidDecision)
        now = self.store.clock()
        records = self.store.pending_approvals(now, session_id=session_id, limit=limit)
        tools, settings = self.tools, self.settings
        holders = self.freezes.holders([r.key for r in records])
        return [
            PendingApproval.of(
                r,
                repeat_evidence(self.store, r),
                shown_preview(r, tools, settings, now),
                held_reason(holders[r.key]) if r.key in holders else None,
            )
            for r in records
        ]

    # --- helpers -------------------------------------------------------------------------------

    def _check(
        self, key: str, approver: str, text: str | None, what: str
    ) -> tuple[str, str, str | None]:
        """Validate before touching anything: a refused decision writes nothing (S9.3)."""
        key = CallKey.parse(key).key
        if not isinstance(approver, str) or not approver.strip():
            raise InvalidDecision("a decision needs the name of the person who made it")
        approver = approver.strip()
        if len(approver) > MAX_ID_LENGTH:
            raise InvalidDecision(
                f"approver name is {len(approver)} characters long; the limit is {MAX_ID_LENGTH}"
            )
        if any(unicodedata.category(ch).startswith("C") for ch in approver):
            raise InvalidDecision(f"approver name {approver!r} contains control characters")
        if text is not None:
            if not isinstance(text, str):
                raise InvalidDecision(f"the {what} must be text, got {type(text).__name__}")
            text = text.strip() or None
        if text is not None and (lone_surrogate(text) is not None or "\x00" in text):
            # Not storable text: no UTF-8 for a lone surrogate, no NUL in a PostgreSQL string.
            raise InvalidDecision(f"the {what} holds a lone surrogate or a NUL character")
        if text is not None and len(text.encode()) > self.settings.max_text_bytes:
            raise InvalidDecision(
                f"the {what} is {len(text.encode())} bytes; "
                f"the limit is {self.settings.max_text_bytes}"
            )
        return key, approver, text

    def _get(self, key: str) -> ToolCallRecord:
        record = self.store.get_call(key)
        if record is None:
            raise UnknownCall(f"no tool call {key!r}")
        return record

    def _refusal(self, key: str, now: float) -> ApprovalError | UnknownCall:
        """The conditional update matched nothing: say exactly why (S6.3)."""
        record = self.store.get_call(key)
        if record is None:
            return UnknownCall(f"no tool call {key!r}")
        status = record.status.value
        if record.status is CallStatus.AWAITING_APPROVAL:
            deadline = record.approval_deadline or now
            if deadline <= now:
                # Past its deadline and not swept yet: end it now, as the sweeper would.
                expire_approval(self.store, self.ledger, record, now)
                return ApprovalDeadlinePassed(
                    f"the approval deadline of {key} passed at {format_utc(deadline, millis=False)}; "
                    "the call is rejected and will not run",
                    key=key,
                    status=CallStatus.REJECTED.value,
                )
            # Only a clock far behind the database's writers gets here.
            return ApprovalError(
                f"could not record the decision on {key}; it is still waiting, try again",
                key=key,
                status=status,
            )
        approval = record.approval
        if approval is None:
            return NotAwaitingApproval(
                f"{key} ({record.tool_name}, {record.effect.value}) never needed approval; "
                f"it is {status}",
                key=key,
                status=status,
            )
        if approval.decision == Decision.EXPIRED.value:
            deadline = record.approval_deadline or approval.decided_at
            return ApprovalDeadlinePassed(
                f"the approval deadline of {key} passed at {format_utc(deadline, millis=False)}; "
                "the call was rejected and will not run",
                key=key,
                status=status,
            )
        return AlreadyDecided(
            f"{key} was already {approval.decision} by {approval.decided_by} at "
            f"{format_utc(approval.decided_at, millis=False)}; that decision stands (the call is {status})",
            key=key,
            status=status,
            decision=approval.decision,
            decided_by=approval.decided_by,
            decided_at=approval.decided_at,
        )

    def _announce(
        self,
        key: str,
        decision: Decision,
        by: str,
        note: str | None,
        *,
        finished_error: str | None = None,
    ) -> None:
        """`tool_call_decided` (and `tool_call_finished` for a rejection) on the events stream.

        The decision is already in SQL; an events stream that cannot be reached loses only the
        announcement, never the decision.
        """
        try:
            events = self.ledger.events
            events.publish(
                EventType.TOOL_CALL_DECIDED, key, decision=decision.value, by=by, note=note or ""
            )
            if finished_error is not None:
                events.publish_finished(key, status=CallStatus.REJECTED.value, error=finished_error)
        except Exception:
            log.exception("could not announce the decision on %s", key)
