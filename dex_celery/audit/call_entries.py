"""The entries of a call's decisions, built from what the store writes (S13.4.1).

Each builder takes the values the store's own write has in hand (the row it inserts, the outcome
it records, what its UPDATE returned), so appending reads nothing more. Arguments, results,
errors and notes are kept as digests: the entry proves what the record said without holding it
(the display rule, docs/secrets.md). `CallWord` is the state the chain's entries leave a call
in, which `audit verify` compares with the live record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dex_celery.audit.entries import AuditKind, Entry, digest
from dex_celery.ledger.attempt_log import parse_attempt_log
from dex_celery.model.budgets import BudgetCharge, charges_of_json
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ApprovalDecision
from dex_celery.store.values import Outcome


def requested(row: Mapping[str, Any]) -> list[Entry]:
    """A new call (the request's INSERT row, after the repeat guard's say): its policy snapshot
    and first status; `approval_asked` too when it waits for a person."""
    key, session = row["key"], row["session_id"]
    entries = [
        Entry(
            AuditKind.CALL_REQUESTED,
            {
                "tool": row["tool_name"],
                "arguments": digest(row["arguments"]),
                "policy": row["policy"],  # the snapshot's own canonical JSON text
                "status": row["status"],
            },
            key,
            session,
            row["requested_at"],
        )
    ]
    if row["status"] == CallStatus.AWAITING_APPROVAL.value:
        asked = {"deadline": row["approval_deadline"], "repeat_of": row.get("repeat_of")}
        entries.append(Entry(AuditKind.APPROVAL_ASKED, asked, key, session, row["requested_at"]))
    return entries


def budget_reserved(row: Mapping[str, Any], charges: Iterable[BudgetCharge]) -> list[Entry]:
    """A budgeted call's charges as its request records them (S13.1.1), one entry per budget:
    what the ledger's open then reserves (S13.1.2). A call the open finds over a budget is
    asked again (`asked_again`, "over budget"); its charge is released when it ends."""
    key, session = row["key"], row["session_id"]
    return [
        Entry(AuditKind.BUDGET_RESERVED, _charge(c), key, session, row["requested_at"])
        for c in charges
    ]


#: What becomes of a charge when its call ends (S13.1.3), by the status the database holds.
_SETTLED = {
    CallStatus.SUCCEEDED.value: AuditKind.BUDGET_SPENT,
    CallStatus.OUTCOME_UNKNOWN.value: AuditKind.BUDGET_HELD,
}


def budget_settled(key: CallKey, charges: str | None, status: str, at: float | None) -> list[Entry]:
    """The charges of a call that ended (`charges`: the record's `budgets` column, as its
    outcome's UPDATE returned it): spent if it succeeded, held while its outcome is unknown,
    released if it failed (did not run) or was rejected. None for a call without charges."""
    kind = _SETTLED.get(status, AuditKind.BUDGET_RELEASED)
    return [
        Entry(kind, {**_charge(c), "status": status}, key.key, key.session_id, at)
        for c in charges_of_json(charges)
    ]


def budget_reconciled(
    key: str, charges: str | None, verdict: str, spent: bool, at: float
) -> list[Entry]:
    """An unknown outcome's held charges, settled by reconciliation's verdict (S13.1.3): went
    through (`spent`) or did not run (released)."""
    kind = AuditKind.BUDGET_SPENT if spent else AuditKind.BUDGET_RELEASED
    session = CallKey.parse(key).session_id
    return [
        Entry(kind, {**_charge(c), "verdict": verdict}, key, session, at)
        for c in charges_of_json(charges)
    ]


def _charge(c: BudgetCharge) -> dict[str, Any]:
    """A charge as entries name it: the budget, its scope, the amount and the limit it was
    judged by (with its measure and window: what the limit counts)."""
    return {
        "budget": c.name,
        "scope": c.scope_id,
        "charge": c.amount,
        "limit": c.limit,
        "measure": c.measure,
        "window": c.window,
    }


def decided(key: str, decision: ApprovalDecision, status: str | None) -> Entry:
    """A person's (or the deadline's) decision; `status` is the call's status it leaves, when
    the decision alone moves it (an approval: `pending`)."""
    kind = (
        AuditKind.APPROVAL_EXPIRED if decision.decision == "expired" else AuditKind.APPROVAL_DECIDED
    )
    body: dict[str, Any] = {
        "decision": decision.decision,
        "decided_by": decision.decided_by,
        "note": digest(decision.note),
    }
    if status is not None:
        body["status"] = status
    return Entry(kind, body, key, CallKey.parse(key).session_id, decision.decided_at)


def ended(
    key: CallKey,
    outcome: Outcome,
    finished_at: float,
    claim: Mapping[Any, Any] | None = None,
) -> list[Entry]:
    """A call's attempts, as its attempt log and write fence tell them, then its outcome."""
    session = key.session_id
    entries: list[Entry] = []
    if claim is not None and claim.get("claimed_at") is not None:
        started = {"attempt": claim.get("claimed_attempt"), "worker": claim.get("claimed_by")}
        entries.append(
            Entry(AuditKind.ATTEMPT_STARTED, started, key.key, session, claim["claimed_at"])
        )
    for attempt in _attempts(outcome.attempt_log):
        worker = {"attempt": attempt.attempt, "worker": attempt.owner}
        if attempt.claimed_at is not None:
            entries.append(
                Entry(AuditKind.ATTEMPT_CLAIMED, worker, key.key, session, attempt.claimed_at)
            )
        done = {**worker, "state": attempt.state, "error": digest(attempt.error or None)}
        entries.append(Entry(AuditKind.ATTEMPT_ENDED, done, key.key, session, attempt.ended_at))
    entries.append(
        Entry(
            AuditKind.OUTCOME,
            {
                "status": outcome.status.value,
                "error": digest(outcome.error or None),
                "result": digest(outcome.result),
                "attempts": outcome.attempts,
            },
            key.key,
            session,
            finished_at,
        )
    )
    return entries


def _attempts(log: str | None) -> Iterable[Any]:
    try:
        return parse_attempt_log(log)
    except (ValueError, KeyError, TypeError):  # a log the ledger wrote oddly: the outcome stays
        return ()


def late_result(key: str, late: str) -> Entry:
    return Entry(
        AuditKind.LATE_RESULT, {"late_result": digest(late)}, key, CallKey.parse(key).session_id
    )


def report_sent(key: str, session_id: str, text: str, at: float) -> Entry:
    return Entry(AuditKind.REPORT_SENT, {"report": digest(text)}, key, session_id, at)


def pruned(keys: list[str], cutoff: float) -> Entry:
    """A prune's batch: the calls it removed, so `audit verify` knows they went by the
    retention, not behind its back."""
    return Entry(AuditKind.HISTORY_PRUNED, {"calls": keys, "cutoff": cutoff})


def asked_again(key: str, status: str, why: str, deadline: float | None) -> Entry:
    """A call sent (back) to wait for a person after its request: a tool redeployed since its
    approval (the decision is cleared), a budget it does not fit, a freeze."""
    body = {"status": status, "why": why, "deadline": deadline, "cleared": why == "rewait"}
    return Entry(AuditKind.APPROVAL_ASKED, body, key, CallKey.parse(key).session_id)


def edited(key: str, arguments: str, by: str) -> Entry:
    """An approver's edit of the arguments (the digest of what the call now runs with)."""
    body = {"arguments": digest(arguments), "edited_by": by}
    return Entry(AuditKind.APPROVAL_EDITED, body, key, CallKey.parse(key).session_id)


def freeze(kind: AuditKind, tool: str, by: str, reason: str | None, mode: str | None) -> Entry:
    """A write freeze begun or thawed (S13.2)."""
    return Entry(kind, {"tool": tool, "by": by, "reason": reason, "mode": mode})


def released(key: str) -> Entry:
    """A call a thaw let run again (`pending`)."""
    body = {"status": CallStatus.PENDING.value}
    return Entry(AuditKind.THAW, body, key, CallKey.parse(key).session_id)


@dataclass(slots=True)
class CallWord:
    """The chain's last word on a call: its entries (from several writers) read in time order,
    an outcome ending the call whatever comes after it."""

    said: list[tuple[float, int, str, dict[str, Any]]] = field(default_factory=list)
    requested: bool = False
    status: str | None = None
    outcome: str | None = None
    decision: str | None = None
    decided_by: str | None = None
    decided: bool = False
    result: str | None = None
    error: str | None = None
    #: The entry that said the most (how a finding names it).
    last: str = ""
    _rank: int = -1

    def take(self, kind: str, body: Mapping[str, Any], label: str, at: float = 0.0) -> None:
        rank = _RANKS.get(kind, -1)
        if rank >= self._rank:
            self.last, self._rank = label, rank
        self.said.append((at, rank, kind, dict(body)))

    def fold(self) -> None:
        for _at, _rank, kind, body in sorted(self.said, key=lambda s: (s[0], s[1])):
            if kind == AuditKind.OUTCOME:
                self.outcome = self.status = body.get("status")
                self.result, self.error = body.get("result"), body.get("error")
            elif self.outcome is not None:
                continue
            elif kind == AuditKind.CALL_REQUESTED:
                self.requested = True
                self.status = body.get("status")
            elif kind in (AuditKind.APPROVAL_DECIDED, AuditKind.APPROVAL_EXPIRED):
                self.decided = True
                self.decision, self.decided_by = body.get("decision"), body.get("decided_by")
                self.status = body.get("status") or self.status
            elif kind in (AuditKind.APPROVAL_ASKED, AuditKind.THAW):
                self.status = body.get("status") or self.status
                if body.get("cleared"):
                    self.decision = self.decided_by = None
        self.said = []

    def disagreements(self, row: Mapping[str, Any]) -> list[str]:
        """Where the live record differs from this word (only what the chain has said: a call
        whose first entries were pruned is compared on what is left)."""
        self.fold()
        found: list[str] = []
        if self.status is not None and row["status"] != self.status:
            found.append(f"status {row['status']!r}, the chain says {self.status!r}")
        if self.outcome is not None:
            if digest(row["result"]) != self.result:
                found.append("its result is not the one the outcome entry holds")
            if digest(row["error"] or None) != self.error:
                found.append("its error is not the one the outcome entry holds")
        decided = (row["decision"], row["decided_by"]) != (self.decision, self.decided_by)
        if (self.decided or self.requested) and decided:
            said = self.decision or "no decision"
            found.append(
                f"decision {row['decision']!r} by {row['decided_by']!r}, the chain says {said}"
            )
        return found


#: Which entry names a call's last word: the furthest along its life.
_RANKS: dict[str, int] = {
    AuditKind.CALL_REQUESTED: 0,
    AuditKind.BUDGET_RESERVED: 0,
    AuditKind.APPROVAL_ASKED: 1,
    AuditKind.APPROVAL_DECIDED: 2,
    AuditKind.APPROVAL_EXPIRED: 2,
    AuditKind.APPROVAL_EDITED: 2,
    AuditKind.ATTEMPT_CLAIMED: 3,
    AuditKind.ATTEMPT_STARTED: 3,
    AuditKind.ATTEMPT_ENDED: 4,
    AuditKind.OUTCOME: 5,
    AuditKind.BUDGET_SPENT: 5,
    AuditKind.BUDGET_HELD: 5,
    AuditKind.BUDGET_RELEASED: 5,
    AuditKind.LATE_RESULT: 6,
    AuditKind.REPORT_SENT: 6,
}
