"""The repeat guard's rule (S5.4): when an identical earlier call makes a new one unsafe to run.

A `non_idempotent_write` can repeat its effect, and each model turn mints a new tool-call id, so
the idempotency key (S2.1) differs between turns and no service can deduplicate them. The guard
compares what the call does instead (its tool and canonical arguments, per session) with the last
identical call that passed the guard, and judges that earlier call here. The store finds it (one
indexed lookup, `store/repeat_guards.py`); the dispatcher holds the new call back for a person.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord


class RepeatKind(StrEnum):
    """Why an identical earlier call makes a new one wait."""

    #: The earlier call is pending: queued or running now.
    IN_FLIGHT = "in_flight"
    #: The earlier call waits for a person and may still be approved and run.
    AWAITING_APPROVAL = "awaiting_approval"
    #: The earlier call timed out (recorded `failed`) but its fenced attempt may still be
    #: running: no late result yet and its worker still holds its lease.
    STILL_RUNNING = "still_running"
    #: The earlier call is `outcome_unknown` and not reconciled yet.
    UNRECONCILED = "unreconciled"
    #: The earlier call succeeded within the policy's `repeat_window`.
    RECENT_SUCCESS = "recent_success"


@dataclass(frozen=True, slots=True)
class RepeatHazard:
    """An earlier identical call and why it holds a new one back."""

    earlier: str
    kind: RepeatKind

    @property
    def reason(self) -> str:
        """What the approval request, the record, `calls show`, the web page and the webhook
        say about why the call waits; it names the earlier call."""
        return repeat_reason(self.kind, self.earlier)


def repeat_reason(kind: RepeatKind, earlier: str) -> str:
    if kind is RepeatKind.UNRECONCILED:
        return (
            f"an identical call {earlier} may have taken effect; its outcome is not reconciled yet"
        )
    if kind is RepeatKind.AWAITING_APPROVAL:
        return f"an identical call {earlier} is waiting for approval and may still run"
    if kind is RepeatKind.RECENT_SUCCESS:
        return f"an identical call {earlier} succeeded a short while ago (the tool's repeat window)"
    return f"an identical call {earlier} may still be running"


def judge_repeat(
    earlier: ToolCallRecord,
    *,
    reconciled: bool,
    still_running: bool,
    now: float,
    window: float,
) -> RepeatHazard | None:
    """The guard's rule for the last identical call that passed it; None: the new call may pass.

    `reconciled`: the earlier call's real outcome was reported to the session (S8.1).
    `still_running`: the earlier call's fenced attempt still holds its lease in the ledger (its
    worker lives and has not finished it). `window`: the new call's `repeat_window`.
    """
    status = earlier.status
    if status is CallStatus.PENDING:
        return RepeatHazard(earlier.key, RepeatKind.IN_FLIGHT)
    if status is CallStatus.AWAITING_APPROVAL:
        return RepeatHazard(earlier.key, RepeatKind.AWAITING_APPROVAL)
    if status is CallStatus.OUTCOME_UNKNOWN and not reconciled:
        return RepeatHazard(earlier.key, RepeatKind.UNRECONCILED)
    if status is CallStatus.FAILED and earlier.late_result is None and still_running:
        return RepeatHazard(earlier.key, RepeatKind.STILL_RUNNING)
    if (
        status is CallStatus.SUCCEEDED
        and window > 0
        and now - (earlier.finished_at or earlier.requested_at) < window
    ):
        return RepeatHazard(earlier.key, RepeatKind.RECENT_SUCCESS)
    return None


def held_rejection_note(earlier: str, reason: str) -> str:
    """Added to the error of a held-back call that ends `rejected`: the model must read that the
    earlier call may have taken effect, never that it is safe to call again."""
    return (
        f"This call repeated {earlier}, which was not known to be over: {reason}. The earlier "
        "call may have taken effect; do not assume it failed or that calling again is safe: "
        "check its outcome first, or ask the user."
    )


@dataclass(frozen=True, slots=True)
class RepeatEvidence:
    """What an approver of a held-back call sees of the earlier call, read when shown: the
    reason it was held, and what has become of the earlier call since (S5.4)."""

    earlier: str
    reason: str
    earlier_status: str | None
    late_result: bool
    reconciled: bool

    @property
    def now_text(self) -> str:
        """The earlier call as of this reading, for a person."""
        if self.earlier_status is None:
            return "the earlier call is no longer recorded"
        text = f"the earlier call is {self.earlier_status}"
        if self.late_result:
            text += "; its late result has arrived (see the earlier call)"
        if self.reconciled:
            text += "; it has been reconciled (its real outcome was reported to the session)"
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "repeat_of": self.earlier,
            "reason": self.reason,
            "earlier_status": self.earlier_status,
            "earlier_late_result": self.late_result,
            "earlier_reconciled": self.reconciled,
            "earlier_now": self.now_text,
        }
