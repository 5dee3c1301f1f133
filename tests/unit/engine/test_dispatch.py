"""The dispatcher's rules as pure functions (`dex_celery/engine/request/dispatch.py`): admission (S6.1),
"same ids, same call" (S2.3), the outcome of a finished step, and the one claimed-write rule
(S10.2). The dispatcher's I/O is covered by the integration and crash tests."""

from __future__ import annotations

from typing import Any

import pytest

from dex_celery import CallConflict, CallStatus, EffectClass, Settings, ToolPolicy
from dex_celery.engine.decided_outcomes import outcome_of
from dex_celery.engine.request.dispatch import admit, same_call
from dex_celery.engine.steps import claimed_write_outcome
from dex_celery.ledger.ledger import Step, StepKind
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.model.policy import PolicySnapshot, resolve_policy
from dex_celery.store.values import NewCall
from tests.support.stores.call_records import call_record


def _snapshot(effect: EffectClass, **policy: Any) -> PolicySnapshot:
    return resolve_policy(ToolPolicy(effect=effect, **policy), None, None, Settings())


def _unused(*_: Any) -> Any:
    raise AssertionError("same_call never resolves a policy")


def test_a_call_that_needs_approval_waits_until_its_deadline() -> None:
    admission = admit(_snapshot(EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=60.0), 1000.0)
    assert admission.status is CallStatus.AWAITING_APPROVAL
    assert admission.approval_deadline == 1060.0


def test_a_read_is_pending_at_once() -> None:
    admission = admit(_snapshot(EffectClass.READ), 1000.0)
    assert admission.status is CallStatus.PENDING and admission.approval_deadline is None


def test_same_ids_with_another_tool_or_other_arguments_conflict() -> None:
    new = NewCall(CallKey.of("s", "t", "c"), "charge", '{"amount":1}', resolve=_unused)
    same_call(new, "charge", '{"amount":1}')  # the same call: no error
    with pytest.raises(CallConflict, match="for tool 'refund', not 'charge'"):
        same_call(new, "refund", '{"amount":1}')
    with pytest.raises(CallConflict, match="other arguments"):
        same_call(new, "charge", '{"amount":2}')


def test_a_step_that_did_not_run_says_so_and_one_that_may_have_run_says_that() -> None:
    never = outcome_of(
        Step(StepKind.FINISHED, attempt=1, status="failed", reason="did_not_run", detail="x"),
        None,
    )
    assert never.did_not_run and (never.error or "").startswith(DID_NOT_RUN)
    lost = outcome_of(
        Step(StepKind.FINISHED, attempt=1, status="outcome_unknown", reason="lost", detail="x"),
        None,
    )
    assert not lost.did_not_run and lost.status is CallStatus.OUTCOME_UNKNOWN


def test_a_claimed_write_whose_ledger_entry_was_lost_is_outcome_unknown() -> None:
    snapshot = _snapshot(EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False)
    record = call_record(policy=snapshot, attempts=1, claimed_by="host:123")
    outcome = claimed_write_outcome(record, 1)
    assert outcome.status is CallStatus.OUTCOME_UNKNOWN
    assert "claimed by host:123" in (outcome.error or "")
    assert not (outcome.error or "").startswith(DID_NOT_RUN)
