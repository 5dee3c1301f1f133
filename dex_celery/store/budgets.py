"""Write budgets in the system of record (S13.1): charges, over-budget admissions, recounts.

The ledger decides admission (`ledger/scripts/open.lua`); SQL keeps what a recount needs after
Redis lost a budget scope or went back in time: each call's charge (`dex_budget_charges`,
written in the request's transaction) and the call's status. A recount is conservative
(docs/guardrails.md, "Budgets"): every call not ended is reserved (a pending call not claimed
yet is judged again when it is opened, without itself), every unknown outcome without a verdict
is held, every success (or "went through" verdict) within the
window is spent; only a call that ended otherwise is released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, func, insert, select, update

from dex_celery.audit import call_entries
from dex_celery.model.budgets import BudgetCharge
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ApprovalDecision
from dex_celery.store.base import StoreBase
from dex_celery.store.schema import budget_charges, tool_calls, unknown_outcomes
from dex_celery.store.values import Outcome

#: The verdicts reconciliation keeps (`dex_unknown_outcomes.verdict`).
WENT_THROUGH = "went_through"
DID_NOT_RUN = "did_not_run"
#: Who decided a call its budget rejected.
BUDGET_DECIDER = "system: budget"


@dataclass(frozen=True, slots=True)
class CountedCharge:
    """One call's charge as a recount sees it: state r (reserved: claimed), p (pending, not
    claimed: reserved until the ledger judges it again), s (spent), h (held)."""

    key: str
    state: str
    amount: int
    spent_at: float


def insert_charges(
    conn: Connection, key: str, charges: Sequence[BudgetCharge], requested_at: float
) -> None:
    """A new call's charges, in its request's transaction."""
    conn.execute(
        insert(budget_charges),
        [
            dict(
                budget=c.name,
                scope=c.scope_id,
                call_key=key,
                amount=c.amount,
                requested_at=requested_at,
            )
            for c in charges
        ],
    )


class BudgetRecords(StoreBase):
    """The write-budget part of `Store`."""

    def count_charges(self, charge: BudgetCharge, *, now: float) -> list[CountedCharge]:
        """Every charge a rebuilt scope must hold, judged from SQL (conservatively)."""
        since = now - charge.window if charge.window > 0 else None
        query = (
            select(
                budget_charges.c.call_key,
                budget_charges.c.amount,
                tool_calls.c.status,
                tool_calls.c.finished_at,
                tool_calls.c.claim_fence,
                unknown_outcomes.c.verdict,
                unknown_outcomes.c.reported_at,
            )
            .join(tool_calls, tool_calls.c.key == budget_charges.c.call_key)
            .outerjoin(unknown_outcomes, unknown_outcomes.c.call_key == budget_charges.c.call_key)
            .where(budget_charges.c.budget == charge.name)
            .where(budget_charges.c.scope == charge.scope_id)
        )
        out: list[CountedCharge] = []
        with self.engine.connect() as conn:
            for row in conn.execute(query):
                counted = _judged(row, now)
                if counted is None:
                    continue
                state, at = counted
                if state == "s" and since is not None and at < since:
                    continue
                out.append(CountedCharge(row.call_key, state, int(row.amount), at))
        return out

    def hold_for_budget(
        self, key: str, reason: str, *, deadline: float, reject: str | None = None
    ) -> bool:
        """A call the ledger found over its budget (S13.1), still pending and unclaimed: it
        waits for a person until `deadline`, saying why; or, with `reject` (the text the model
        reads), it ends `rejected`. One conditional update; False if it moved on already."""
        if reject is not None:
            decision = ApprovalDecision("rejected", BUDGET_DECIDER, self.clock(), reason)
            # `did_not_run`: only while no claim of it exists (the write fence).
            outcome = Outcome(CallStatus.REJECTED, reject, did_not_run=True)
            ended: bool = self.record_outcome(  # type: ignore[attr-defined]
                key, outcome, decision=decision
            )
            if ended:
                with self.engine.begin() as conn:
                    conn.execute(
                        update(tool_calls)
                        .where(tool_calls.c.key == key)
                        .values(budget_reason=reason)
                    )
            return ended
        with self.engine.begin() as conn:
            result = conn.execute(
                update(tool_calls)
                .where(
                    and_(
                        tool_calls.c.key == key,
                        tool_calls.c.status == CallStatus.PENDING.value,
                        tool_calls.c.claim_fence.is_(None),
                        tool_calls.c.decision.is_(None),
                    )
                )
                .values(
                    status=CallStatus.AWAITING_APPROVAL.value,
                    approval_deadline=deadline,
                    budget_reason=reason,
                )
            )
            if result.rowcount != 1:
                return False
            waits = CallStatus.AWAITING_APPROVAL.value
            asked = call_entries.asked_again(key, waits, "over budget", deadline)
            appended = self.audit.append(conn, asked)
        appended.committed()
        return True

    def calls_waiting_for_budget(self) -> int:
        """Calls waiting for a person because a budget had too little left (the awaiting
        index, then the reason)."""
        query = (
            select(func.count())
            .select_from(tool_calls)
            .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
            .where(tool_calls.c.budget_reason.is_not(None))
        )
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def budget_scopes(
        self, *, budget: str | None = None, scope: str | None = None
    ) -> list[tuple[str, str]]:
        """The (budget, scope) pairs SQL knows charges of, for `budgets show`."""
        query = select(budget_charges.c.budget, budget_charges.c.scope).distinct()
        if budget is not None:
            query = query.where(budget_charges.c.budget == budget)
        if scope is not None:
            query = query.where(budget_charges.c.scope == scope)
        with self.engine.connect() as conn:
            return sorted((r.budget, r.scope) for r in conn.execute(query.limit(1000)))


def _judged(row: Any, now: float) -> tuple[str, float] | None:
    """(state, when spent) of one charge from its call's record; None: released."""
    status = CallStatus(row.status)
    verdict = row.verdict
    finished = row.finished_at or now
    if status is CallStatus.PENDING:
        return ("r" if row.claim_fence is not None else "p"), now
    if status is CallStatus.SUCCEEDED:
        return "s", finished
    if status is CallStatus.OUTCOME_UNKNOWN:
        if verdict == DID_NOT_RUN:
            return None
        if verdict == WENT_THROUGH:
            return "s", row.reported_at or finished
        return "h", now
    return None
