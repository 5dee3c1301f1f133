"""Write budgets at a call's admission (S13.1): what `open` is given, and what its refusals do.

The ledger's `open.lua` judges and reserves every charge of a call in the step that opens it
(one atomic step for every requester and worker). Here the dispatcher's side: the charges of a
recorded call as `open` takes them, the rebuild of a scope the ledger no longer holds (counted
from SQL, conservatively: `store/budgets.py`), and a call over its budget, which waits for a
person saying why, or ends `rejected` with text the model can act on (docs/guardrails.md).
"""

from __future__ import annotations

import logging

from dex_celery.errors import LedgerError
from dex_celery.ledger.ledger import BudgetArg, Ledger, OpenReply
from dex_celery.model.budgets import BudgetCharge, OverBudget, charges_of_json
from dex_celery.model.event_types import EventType
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.store.repository import Store

log = logging.getLogger("dex_celery.engine.budgets")


def approved(record: ToolCallRecord) -> bool:
    """A person approved this call: it is admitted even over its budgets (they were told)."""
    return record.approval is not None and record.approval.decision == "approved"


def charge_args(ledger: Ledger, record: ToolCallRecord) -> list[BudgetArg]:
    """The record's charges as `Ledger.open_replies` takes them."""
    force = approved(record)
    return [
        (ledger.keys.budget(c.name, c.scope_id), c.limit, c.amount, c.window, force)
        for c in charges_of_json(record.budgets)
    ]


def rebuild(ledger: Ledger, store: Store, epoch: str, charge: BudgetCharge) -> None:
    """Count one scope again from SQL into the ledger life `epoch` (`budget_seed.lua`)."""
    now = ledger.now()
    counted = store.count_charges(charge, now=now)
    kind = ledger.seed_budget(
        ledger.keys.budget(charge.name, charge.scope_id),
        epoch=epoch,
        window=charge.window,
        charges=[(c.key, c.state, c.amount, c.spent_at) for c in counted],
    )
    log.info(
        "budget %s %s counted from SQL: %d charges (%s)",
        charge.name,
        charge.scope_id,
        len(counted),
        kind,
    )


def rejected_text(charge: BudgetCharge, reason: str) -> str:
    """What the model reads of a call its budget rejected: why, and what it can do."""
    return (
        f"not run: the write budget {charge.name} is used up ({reason}). Nothing was done; "
        "do not try this call again now: tell the user, or ask a person to raise the budget"
    )


def over_budget(
    ledger: Ledger, store: Store, record: ToolCallRecord, reply: OpenReply
) -> ToolCallRecord | None:
    """The ledger refused to open `record`: charge `reply.budget` has too little left. The call
    waits for a person (or ends `rejected`, as its budget says) with the reason; returns the
    record as it then is (None if it moved on meanwhile)."""
    charge = charges_of_json(record.budgets)[reply.budget]
    reason = charge.over_text(reply.reserved + reply.spent, reply.held)
    events = ledger.events
    # The open that would have announced the request opened nothing: announce it here, once
    # (only a call never approved reaches this; the first to move it announces).
    announce = record.approval is None and record.status is CallStatus.PENDING
    if charge.over is OverBudget.REJECT:
        text = rejected_text(charge, reason)
        if store.hold_for_budget(record.key, reason, deadline=0.0, reject=text):
            if announce:
                events.publish(
                    EventType.TOOL_CALL_REQUESTED, record.key, effect=record.effect.value
                )
            events.publish(
                EventType.TOOL_CALL_DECIDED, record.key, decision="rejected", by="budget"
            )
            events.publish_finished(record.key, status="rejected", error=text)
    else:
        deadline = ledger.now() + record.policy.approval_timeout
        if store.hold_for_budget(record.key, reason, deadline=deadline):
            if announce:
                events.publish(
                    EventType.TOOL_CALL_REQUESTED, record.key, effect=record.effect.value
                )
            events.publish(
                EventType.TOOL_CALL_AWAITING_APPROVAL,
                record.key,
                deadline=str(deadline),
                repeat_of="",
                reason=reason,
            )
    log.info("call %s is over budget %s: %s", record.key, charge.name, reason)
    return store.get_call(record.key)


def needs_rebuild(
    ledger: Ledger, store: Store, epoch: str, record: ToolCallRecord, reply: OpenReply
) -> None:
    """Rebuild the scope `open` asked for; the caller opens again."""
    charges = charges_of_json(record.budgets)
    if not 0 <= reply.budget < len(charges):
        raise LedgerError(f"open named budget {reply.budget + 1} of {record.key}, which has none")
    rebuild(ledger, store, epoch, charges[reply.budget])
