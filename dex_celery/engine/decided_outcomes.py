"""Outcomes the ledger decided: the one rule from a decided step to the outcome SQL records
(`outcome_of`), and which decided outcomes a caller may learn before SQL holds them.

A worker's attempt ends in the ledger (`finish.lua`, which announces `tool_call_ended`) before
its SQL record is written: the worker's outcome recorder writes outcomes in batches, off the
tool's path (docs/ledger.md, "Recording outcomes"). The ledger's decided outcome is exactly what
the record will say: the recorder writes it, or a waiting caller (`DexClient.wait`), or the
sweeper after its grace, each from the same ledger entry, with the same `finished_at` (when the
ledger decided it); the write is conditional, so whoever is first records it, once.

Only the two ends a worker reports from its tool are taken from the ledger this way: it
succeeded, or the tool failed (`tool_error`, retries included). Every other end (lost, timed
out, "did not run", a claim the database could not confirm) may still be judged from SQL's
write fence when it is recorded (`Steps.record`), and is left to the worker's own path.
"""

from __future__ import annotations

import dataclasses

from dex_celery.ledger.attempt_log import parse_attempt_log
from dex_celery.ledger.ledger import LedgerCall, Step, StepKind
from dex_celery.model.outcomes import CallStatus, EndReason, error_text
from dex_celery.model.records import ToolCallRecord
from dex_celery.store.values import Outcome

#: Ends the ledger alone decides: (status, reason) as `finish.lua` writes them.
_DECIDED_BY_THE_LEDGER = frozenset(
    {
        (CallStatus.SUCCEEDED.value, EndReason.OK.value),
        (CallStatus.FAILED.value, EndReason.TOOL_ERROR.value),
    }
)


def outcome_of(step: Step, result: str | None) -> Outcome:
    """The SQL outcome of a FINISHED step: status, the error the model reads, attempts."""
    status = CallStatus(step.status)
    reason = EndReason(step.reason)
    return Outcome(
        status=status,
        error=error_text(
            status,
            reason,
            step.detail,
            step.attempt,
            last_reached_worker=last_attempt_state(step.log) != "expired",
        ),
        result=result if status is CallStatus.SUCCEEDED else None,
        attempts=step.attempt,
        attempt_log=step.log,
        did_not_run=reason is EndReason.DID_NOT_RUN,
        decided_at=step.finished_at,
    )


def last_attempt_state(log_json: str | None) -> str:
    """How the last logged attempt ended (`expired`: no worker claimed it); "" if unknown."""
    try:
        entries = parse_attempt_log(log_json)
    except (ValueError, KeyError, TypeError):
        return ""
    return entries[-1].state if entries else ""


def finished_step(entry: LedgerCall) -> Step:
    """The FINISHED step a ledger entry with a decided outcome stands for: what its recording
    (`Steps.record`) is given, by the sweeper or a waiting caller."""
    return Step(
        StepKind.FINISHED,
        attempt=entry.attempt,
        status=entry.status,
        reason=entry.reason,
        log=entry.log_json,
        detail=entry.error,
        finished_at=entry.finished_at,
    )


def decided_step(entry: LedgerCall | None) -> Step | None:
    """The FINISHED step of an outcome the ledger alone decided and SQL may not hold yet; None
    while the call goes on, or for an end SQL may still judge (`Steps.record`)."""
    if entry is None or (entry.status, entry.reason) not in _DECIDED_BY_THE_LEDGER:
        return None
    return finished_step(entry)


def decided(record: ToolCallRecord, entry: LedgerCall | None) -> ToolCallRecord:
    """`record`, or, while SQL still shows it pending, the record the ledger's decided outcome
    will make of it (status, error, result, attempts, attempt log, finished_at)."""
    step = decided_step(entry)
    if step is None or entry is None or record.status is not CallStatus.PENDING:
        return record
    outcome = outcome_of(step, entry.result)
    return dataclasses.replace(
        record,
        status=outcome.status,
        error=outcome.error or None,
        result=outcome.result,
        attempts=outcome.attempts,
        attempt_log=outcome.attempt_log,
        finished_at=outcome.decided_at,
    )
