"""The write fence's give-up and its judgment from SQL (docs/ledger.md, "The write fence").

`lose` in mode `unconfirmed` (a write's worker could not commit its SQL claim) ends the call
`outcome_unknown` with reason `claim_unconfirmed` and only for the fence that holds the attempt;
`steps.unclaimed_write_outcome` turns such an end, and a lost or timed-out one, into the
did-not-run outcome the store writes only while SQL holds no claim; the texts never say the
tool started. Quick checks of the scripts and the texts; the real outage is in
tests/crash/database/test_database_outage_truth.py.
"""

from __future__ import annotations

from dex_celery import DID_NOT_RUN, CallStatus, EffectClass
from dex_celery.engine.decided_outcomes import outcome_of
from dex_celery.engine.steps import unclaimed_write_outcome
from dex_celery.ledger.ledger import LoseMode, Step, StepKind
from dex_celery.model.outcomes import EndReason, error_text
from tests.support.stores.ledger_rig import Rig, claimed, finished


def test_lose_unconfirmed_needs_the_fence_and_ends_the_write_claim_unconfirmed(rig: Rig) -> None:
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    other = rig.ledger.lose(key, 1, mode=LoseMode.UNCONFIRMED, fence="not-mine", detail="x")
    assert other.kind is StepKind.NOOP
    step = rig.ledger.lose(key, 1, mode=LoseMode.UNCONFIRMED, fence="f1", detail="refused")
    finished(step, "outcome_unknown", "claim_unconfirmed")
    assert step.detail == "refused"
    assert rig.hash(key)["state"] == "unconfirmed"


def test_an_unconfirmed_claim_with_a_claim_in_sql_never_says_the_tool_started() -> None:
    step = Step(
        StepKind.FINISHED,
        attempt=1,
        status="outcome_unknown",
        reason="claim_unconfirmed",
        detail="the connection to the database broke while the worker committed its claim",
    )
    outcome = outcome_of(step, None)
    assert outcome.status is CallStatus.OUTCOME_UNKNOWN
    assert not outcome.did_not_run
    assert "after the tool started" not in outcome.error
    assert "before running any tool code" in outcome.error
    assert "holds a claim of this write" in outcome.error


def test_lost_timed_out_and_unconfirmed_writes_are_judged_from_sql() -> None:
    for status, reason in [
        ("outcome_unknown", "lost"),
        ("failed", "timed_out"),
        ("outcome_unknown", "claim_unconfirmed"),
    ]:
        step = Step(StepKind.FINISHED, attempt=1, status=status, reason=reason, detail="d")
        judged = unclaimed_write_outcome(step)
        assert judged is not None and judged.did_not_run, reason
        assert judged.status is CallStatus.FAILED
        assert judged.error.startswith(DID_NOT_RUN)
        assert "no claim" in judged.error


def test_ends_the_ledger_vouches_for_are_not_judged_again() -> None:
    for status, reason in [
        ("succeeded", "ok"),
        ("failed", "tool_error"),
        ("failed", "did_not_run"),
    ]:
        step = Step(StepKind.FINISHED, attempt=1, status=status, reason=reason, detail="d")
        assert unclaimed_write_outcome(step) is None, reason


def test_the_lost_text_is_unchanged_for_writes_the_database_saw_claimed() -> None:
    text = error_text(CallStatus.OUTCOME_UNKNOWN, EndReason.LOST, "its lease lapsed", 1)
    assert text.startswith("the attempt was lost after the tool started")
