"""Approvals bound to what was approved (S13.3, docs/guardrails.md): the SQL side.

- `approve_bound`: the approval's conditional update (`awaiting_approval -> pending`, before the
  deadline) also records the binding it was given for and, for an edit, the new arguments, their
  sealed secrets and digest, and the edit itself, in that one statement: an edit is never stored
  without its approval, nor an approval without its edit.
- `claim_approved`: the worker's claim of an approved call consumes the approval inside the write
  fence: the same conditional update that claims the write requires the approval's binding to be
  the one the worker computed from its own tool and arguments, so a redeployed tool (or a message
  with other arguments) claims nothing; it stamps `approval_used_at` and hands back the edit (for
  the TOOL message). For a retried class (no write fence) the same update runs without a claim.
- `rewait`: an approved call whose binding did not match goes back to `awaiting_approval` with a
  new deadline and the reason, only while nothing claimed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, update

from dex_celery.audit import call_entries
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ApprovalDecision
from dex_celery.store.base import StoreBase
from dex_celery.store.commit import transaction
from dex_celery.store.rows import approval_values
from dex_celery.store.schema import tool_calls


@dataclass(frozen=True, slots=True)
class ArgumentsEdit:
    """An approver's edit, validated and sealed (`engine/request/approvals.py`), ready to store."""

    arguments: str
    sealed: str | None
    arguments_digest: str
    #: `ApprovalEdit.to_json()`: who, when, before, after.
    record: str


@dataclass(frozen=True, slots=True)
class ApprovedClaim:
    """The worker's claim of an approved call: whether it holds, and the edit it runs with."""

    ok: bool
    edit: str | None = None


class ApprovalBinding(StoreBase):
    """The approval-binding aggregate of `Store`."""

    def approve_bound(
        self,
        key: str,
        decision: ApprovalDecision,
        *,
        now: float,
        epoch: str | None,
        binding: str | None,
        edit: ArgumentsEdit | None = None,
        expected_arguments: str | None = None,
    ) -> bool:
        """Approve (S6.2) with the binding, and the edit if any; one winner, as `decide`.

        `expected_arguments`: the stored arguments the edit was made from; another writer's
        edit in between makes this update match nothing."""
        values = {
            **approval_values(decision, epoch),
            "approved_digest": binding,
            "approval_used_at": None,
        }
        if edit is not None:
            values.update(
                arguments=edit.arguments,
                sealed_arguments=edit.sealed,
                arguments_digest=edit.arguments_digest,
                approval_edit=edit.record,
            )
        query = (
            update(tool_calls)
            .where(tool_calls.c.key == key)
            .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
            .where(tool_calls.c.approval_deadline > now)
        )
        if expected_arguments is not None:
            query = query.where(tool_calls.c.arguments == expected_arguments)
        with self.engine.begin() as conn:
            if conn.execute(query.values(**values)).rowcount != 1:
                return False
            entries = [call_entries.decided(key, decision, CallStatus.PENDING.value)]
            if edit is not None:
                entries.append(call_entries.edited(key, edit.arguments, decision.decided_by))
            appended = self.audit.append(conn, *entries)
        appended.committed()
        return True

    def claim_approved(
        self,
        key: str,
        attempt: int,
        *,
        fence: str,
        owner: str,
        now: float,
        binding: str,
        fenced: bool,
    ) -> ApprovedClaim:
        """Consume the approval of `key` for this attempt, inside the write fence (`fenced`:
        the write's claim is made in the same update). Refused (nothing changed) when the call
        is not pending, another attempt holds the write's claim, or the approval's binding is
        not `binding`. A lost COMMIT raises `CommitUnconfirmed`, as `claim_write`."""
        values: dict[str, Any] = {"approval_used_at": now}
        query = (
            update(tool_calls)
            .where(tool_calls.c.key == key)
            .where(tool_calls.c.status == CallStatus.PENDING.value)
            .where(tool_calls.c.approved_digest == binding)
        )
        if fenced:
            query = query.where(
                or_(tool_calls.c.claim_fence.is_(None), tool_calls.c.claim_fence == fence)
            )
            values.update(
                claim_fence=fence, claimed_attempt=attempt, claimed_at=now, claimed_by=owner
            )
        with transaction(self.engine) as conn:
            row = conn.execute(query.values(**values).returning(tool_calls.c.approval_edit)).first()
        if row is None:
            return ApprovedClaim(False)
        return ApprovedClaim(True, row.approval_edit)

    def rewait(
        self,
        key: str,
        *,
        approved: str,
        reason: str,
        deadline: float,
        definition_digest: str,
        arguments_digest: str | None,
    ) -> bool:
        """Send an approved call back to wait for a person: only while it is pending, nothing
        claimed it and it still holds the approval `approved` (so a second worker's rewait, or
        one after a new approval, changes nothing). The previous decision stays in the reason;
        the digests become the worker's, which the next approval is bound to."""
        values: dict[str, Any] = dict(
            status=CallStatus.AWAITING_APPROVAL.value,
            approval_deadline=deadline,
            decision=None,
            decided_by=None,
            decided_at=None,
            decision_note=None,
            approved_digest=None,
            rewait_reason=reason,
            definition_digest=definition_digest,
        )
        if arguments_digest is not None:
            values["arguments_digest"] = arguments_digest
        query = (
            update(tool_calls)
            .where(tool_calls.c.key == key)
            .where(tool_calls.c.status == CallStatus.PENDING.value)
            .where(tool_calls.c.claim_fence.is_(None))
            .where(tool_calls.c.approved_digest == approved)
        )
        with self.engine.begin() as conn:
            if conn.execute(query.values(**values)).rowcount != 1:
                return False
            waits = CallStatus.AWAITING_APPROVAL.value
            asked = call_entries.asked_again(key, waits, "rewait", deadline)
            appended = self.audit.append(conn, asked)
        appended.committed()
        return True
