"""Which outcomes a caller may take from the ledger before SQL holds them (`engine/decided_outcomes.py`,
docs/ledger.md "Recording outcomes"): a success and a tool's own error, exactly as they will be
recorded; never an end SQL may still judge through the write fence (S10.2)."""

from __future__ import annotations

import dataclasses

import pytest

from dex_celery import CallStatus, EffectClass
from dex_celery.engine.decided_outcomes import decided, decided_step, outcome_of
from dex_celery.ledger.ledger import LedgerCall
from dex_celery.model.records import ToolCallRecord
from tests.support.stores.call_records import call_record

LOG = '[{"attempt": 1, "state": "succeeded", "owner": "w:1", "claimed_at": 10.0, "ended_at": 11.5}]'


def _record(status: CallStatus = CallStatus.PENDING) -> ToolCallRecord:
    return call_record(status, effect=EffectClass.READ, tool_name="lookup")


def _entry(status: str, reason: str, *, error: str = "", result: str | None = None) -> LedgerCall:
    return LedgerCall.from_hash(
        "s/t/c",
        {
            "status": status,
            "reason": reason,
            "n": "1",
            "state": status,
            "effect": "read",
            "error": error,
            "log": LOG,
            "finished_at": "11.5",
            **({"result": result} if result is not None else {}),
        },
    )


def test_a_success_decided_in_the_ledger_is_the_record_sql_will_hold() -> None:
    entry = _entry("succeeded", "ok", result='{"n": 1}')
    step = decided_step(entry)
    assert step is not None and step.finished_at == 11.5
    shown = decided(_record(), entry)
    outcome = outcome_of(step, entry.result)
    assert (shown.status, shown.result, shown.error) == (CallStatus.SUCCEEDED, '{"n": 1}', None)
    assert (shown.attempts, shown.attempt_log) == (outcome.attempts, LOG)
    assert shown.finished_at == outcome.decided_at == 11.5


def test_a_tools_own_error_is_taken_with_the_text_the_model_reads() -> None:
    entry = _entry("failed", "tool_error", error="no such order")
    shown = decided(_record(), entry)
    step = decided_step(entry)
    assert step is not None
    assert shown.status is CallStatus.FAILED
    assert shown.error == outcome_of(step, None).error
    assert "no such order" in (shown.error or "")


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ("failed", "did_not_run"),
        ("failed", "lost"),
        ("failed", "timed_out"),
        ("outcome_unknown", "lost"),
        ("outcome_unknown", "claim_unconfirmed"),
        ("active", ""),
    ],
)
def test_ends_sql_may_still_judge_and_calls_in_flight_are_not_taken(
    status: str, reason: str
) -> None:
    entry = _entry(status, reason, error="x")
    assert decided_step(entry) is None
    assert decided(_record(), entry) == _record()


def test_a_record_sql_holds_already_is_never_replaced() -> None:
    ended = dataclasses.replace(_record(CallStatus.FAILED), error="recorded first")
    assert decided(ended, _entry("succeeded", "ok", result="1")) is ended
    assert decided_step(None) is None
    assert decided(_record(), None) == _record()
