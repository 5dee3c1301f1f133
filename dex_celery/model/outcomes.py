"""Call statuses and the exact texts the model reads about them (S4).

These texts are part of the contract: the did-not-run prefix is matched by models and by
operators, and `OUTCOME_UNKNOWN_TOOL_RESULT` is what reconcilers search tool outputs for (S4.5,
S8.1).
"""

from __future__ import annotations

from enum import StrEnum


class CallStatus(StrEnum):
    """A call's status in the system of record; the last four are terminal (S4.1)."""

    AWAITING_APPROVAL = "awaiting_approval"
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    OUTCOME_UNKNOWN = "outcome_unknown"

    @property
    def terminal(self) -> bool:
        return self not in (CallStatus.AWAITING_APPROVAL, CallStatus.PENDING)


#: Every error of a call that provably never ran starts with exactly this (S4.2).
DID_NOT_RUN = "the tool did not run, so it is safe to call again"

#: Contained in the tool-result message of every `outcome_unknown` call (S4.5).
OUTCOME_UNKNOWN_TOOL_RESULT = (
    "OUTCOME UNKNOWN: the tool may or may not have taken effect, and it will not be run again. "
    "Do not call it again for the same purpose until the outcome has been checked."
)


class EndReason(StrEnum):
    """Why the ledger ended a call; chosen by the transition scripts."""

    OK = "ok"
    TOOL_ERROR = "tool_error"
    DID_NOT_RUN = "did_not_run"
    LOST = "lost"
    TIMED_OUT = "timed_out"
    #: A write's worker could not commit (or confirm) its claim in SQL and ran no tool code.
    CLAIM_UNCONFIRMED = "claim_unconfirmed"


def error_text(
    status: CallStatus,
    reason: EndReason,
    detail: str,
    attempts: int,
    *,
    last_reached_worker: bool = True,
) -> str:
    """The `error` a failed or unknown call carries; empty for a success.

    `detail` describes the last attempt only. A call ends `lost` either because that attempt was
    lost after its tool started, or because it never reached a worker (`last_reached_worker`
    False) after an earlier one had started: then the text says which attempt did what, rather
    than calling an attempt no worker claimed "lost after the tool started".
    """
    if status is CallStatus.SUCCEEDED:
        return ""
    tried = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    if reason is EndReason.LOST and not last_reached_worker:
        effect = (
            "the tool may or may not have taken effect"
            if status is CallStatus.OUTCOME_UNKNOWN
            else "no attempts are left"
        )
        return (
            f"attempt {attempts} never reached a worker ({detail or 'expired in the queue'}) after "
            f"an earlier attempt was lost once its tool had started; {effect} ({tried})"
        )
    if reason is EndReason.DID_NOT_RUN:
        return f"{DID_NOT_RUN}: no attempt reached a worker ({tried}; {detail or 'expired in the queue'})"
    if reason is EndReason.TOOL_ERROR:
        return detail or "the tool failed without a message"
    if reason is EndReason.TIMED_OUT:
        return (
            f"the tool ran past its start-to-close timeout and was cancelled ({tried}); the old "
            f"attempt may still finish, and its result will only be kept as evidence. {detail}"
        ).strip()
    if reason is EndReason.CLAIM_UNCONFIRMED:
        # Recorded only when the database shows a claim of the write (otherwise the call is
        # "did not run", `unclaimed_write_text`): the worker's own attempt ran no tool code.
        return (
            f"the worker gave its attempt up before running any tool code ({detail}), but the "
            f"database holds a claim of this write, so it cannot be called not run; the tool "
            f"may or may not have taken effect ({tried})"
        )
    if status is CallStatus.OUTCOME_UNKNOWN:
        return (
            f"the attempt was lost after the tool started ({detail or 'lost'}); "
            f"the tool may or may not have taken effect ({tried})"
        )
    return (
        f"the attempt was lost after the tool started ({detail or 'lost'}) and no attempts are "
        f"left ({tried})"
    )


def unclaimed_write_text(detail: str, attempts: int) -> str:
    """The error of a write the ledger could not finish cleanly (lost, timed out, or given up
    before its claim) whose claim the database never committed: the write fence lets no tool
    code run before that commit, so the tool did not run (S4.2, docs/ledger.md)."""
    tried = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    return (
        f"{DID_NOT_RUN}: the database holds no claim of this write, and a write runs only once "
        f"its claim is committed there ({tried}; {detail or 'no claim'})"
    )


def tool_output(status: CallStatus, result: str | None, error: str) -> str:
    """The text of the TOOL message the model reads for an ended call (S4.4)."""
    if status is CallStatus.SUCCEEDED:
        return result if result is not None else "null"
    if status is CallStatus.OUTCOME_UNKNOWN:
        return f"{OUTCOME_UNKNOWN_TOOL_RESULT}\n{error}"
    if status is CallStatus.REJECTED:
        return f"The call was rejected and did not run: {error}"
    return f"Error: {error}"
