"""`Cause.LOST` from `finish`: a tool whose answer was lost after it may have acted (`ToolLost`,
e.g. an MCP server that died mid-call) ends its attempt as a lost worker would (S4.3), on fakeredis
and on the real redis-server (the rig of `test_ledger_scripts`)."""

from __future__ import annotations

import pytest

from dex_celery.ledger.ledger import Cause, StepKind
from dex_celery.model.policy import EffectClass
from tests.support.stores.ledger_rig import Rig, claimed, finished

DETAIL = "the connection to MCP server 'orders' broke after 'cancel' was called"


@pytest.mark.parametrize("effect", [EffectClass.READ, EffectClass.IDEMPOTENT_WRITE])
def test_lost_answer_of_a_retryable_call_is_retried(rig: Rig, effect: EffectClass) -> None:
    key = claimed(rig, effect)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.LOST, payload=DETAIL)
    assert step.kind is StepKind.RETRY and step.attempt == 2


@pytest.mark.parametrize("effect", [EffectClass.NON_IDEMPOTENT_WRITE, EffectClass.UNCLASSIFIED])
def test_lost_answer_of_a_write_is_outcome_unknown(rig: Rig, effect: EffectClass) -> None:
    key = claimed(rig, effect)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.LOST, payload=DETAIL)
    finished(step, "outcome_unknown", "lost")
    assert step.detail == DETAIL


def test_lost_answer_of_a_read_without_attempts_left_is_failed(rig: Rig) -> None:
    key = claimed(rig, EffectClass.READ, max_attempts=1)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.LOST, payload=DETAIL)
    finished(step, "failed", "lost")


def test_lost_answer_from_a_fenced_attempt_is_only_a_late_result(rig: Rig) -> None:
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    step = rig.ledger.finish(key, 1, fence="someone-else", cause=Cause.LOST, payload=DETAIL)
    assert step.kind is StepKind.LATE
