"""Ends the ledger cannot vouch for are judged from SQL when recorded (docs/ledger.md, "The
write fence"): a write the database never saw claimed did not run, whatever the ledger's step
says (lost after a lapsed lease or a dead worker, timed out, claim unconfirmed); a write whose
claim SQL holds keeps the ledger's word; reads and idempotent writes, whose claims live in Redis
only, are never judged from SQL. Real SQLite and redis-server; the ledger's steps are built by
hand, as the sweeper and the worker hand them to `Steps.record`."""

from __future__ import annotations

import pytest

from dex_celery import DID_NOT_RUN, CallStatus, Dex
from dex_celery.ledger.ledger import Step, StepKind

ENDS = [
    ("outcome_unknown", "lost", "its heartbeat lease lapsed"),
    ("failed", "timed_out", "fenced by the sweeper at its start-to-close deadline"),
    ("outcome_unknown", "claim_unconfirmed", "the worker could not commit its claim"),
]


def _step(status: str, reason: str, detail: str) -> Step:
    return Step(StepKind.FINISHED, attempt=1, status=status, reason=reason, detail=detail)


@pytest.mark.parametrize(("status", "reason", "detail"), ENDS)
@pytest.mark.parametrize("tool", ["slow_non_idempotent_write", "slow_unclassified"])
def test_an_unclaimed_write_did_not_run(
    dex: Dex, tool: str, status: str, reason: str, detail: str
) -> None:
    key = dex.client().request_call("s1", "t1", "c1", tool, {"seconds": 0}).key
    dex.runtime.steps.record(key, _step(status, reason, detail))
    record = dex.client().get_call(key)
    assert record.status is CallStatus.FAILED
    error = record.error or ""
    assert error.startswith(DID_NOT_RUN) and detail in error
    assert "after the tool started" not in error


@pytest.mark.parametrize(("status", "reason", "detail"), ENDS)
def test_a_claimed_write_keeps_the_ledgers_word(
    dex: Dex, status: str, reason: str, detail: str
) -> None:
    key = dex.client().request_call("s1", "t1", "c1", "slow_non_idempotent_write", {}).key
    assert dex.store.claim_write(key, 1, fence="f1", owner="w@h:1", now=dex.ledger.now())
    dex.runtime.steps.record(key, _step(status, reason, detail))
    record = dex.client().get_call(key)
    assert record.status is CallStatus(status)
    error = record.error or ""
    assert not error.startswith(DID_NOT_RUN)
    if reason == "claim_unconfirmed":
        assert "after the tool started" not in error
        assert "holds a claim of this write" in error


@pytest.mark.parametrize("tool", ["slow_read", "slow_idempotent_write"])
def test_calls_with_a_redis_only_claim_are_not_judged_from_sql(dex: Dex, tool: str) -> None:
    key = dex.client().request_call("s1", "t1", "c1", tool, {"seconds": 0}).key
    status = "failed" if tool == "slow_read" else "outcome_unknown"
    dex.runtime.steps.record(key, _step(status, "lost", "its heartbeat lease lapsed"))
    record = dex.client().get_call(key)
    assert record.status is CallStatus(status)
    assert not (record.error or "").startswith(DID_NOT_RUN)
