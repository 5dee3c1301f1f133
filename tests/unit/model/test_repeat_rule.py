"""The repeat guard's rule (S5.4), its policy settings and its digest, without any backend."""

from __future__ import annotations

import json

import pytest

from dex_celery.errors import PolicyError, SecretKeyMissing
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass, PolicySnapshot, ToolPolicy, resolve_policy
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.repeat_rule import RepeatKind, judge_repeat
from dex_celery.settings import Settings
from dex_celery.tools.repeat_digest import repeat_digest, secrets_digest
from tests.support.stores.call_records import call_record

NOW = 1_000_000.0


def _record(status: CallStatus, **kw: object) -> ToolCallRecord:
    values: dict[str, object] = dict(
        key="s/t1/c", turn_id="t1", attempts=1, requested_at=NOW - 10, finished_at=NOW - 5
    )
    return call_record(status, **{**values, **kw})


def _judge(record: ToolCallRecord, **kw: object) -> RepeatKind | None:
    args: dict[str, object] = dict(reconciled=False, still_running=False, now=NOW, window=0.0)
    args.update(kw)
    hazard = judge_repeat(record, **args)  # type: ignore[arg-type]
    return hazard.kind if hazard is not None else None


def test_what_holds_a_repeat_back() -> None:
    assert _judge(_record(CallStatus.PENDING)) is RepeatKind.IN_FLIGHT
    assert _judge(_record(CallStatus.AWAITING_APPROVAL)) is RepeatKind.AWAITING_APPROVAL
    assert _judge(_record(CallStatus.OUTCOME_UNKNOWN)) is RepeatKind.UNRECONCILED
    assert _judge(_record(CallStatus.OUTCOME_UNKNOWN), reconciled=True) is None
    assert _judge(_record(CallStatus.FAILED), still_running=True) is RepeatKind.STILL_RUNNING
    assert _judge(_record(CallStatus.FAILED)) is None  # its lease lapsed: nothing runs
    late = _record(CallStatus.FAILED, late_result='{"attempt": 1}')
    assert _judge(late, still_running=True) is None  # it finished; its result is evidence
    assert _judge(_record(CallStatus.REJECTED)) is None
    assert _judge(_record(CallStatus.SUCCEEDED)) is None
    assert _judge(_record(CallStatus.SUCCEEDED), window=10.0) is RepeatKind.RECENT_SUCCESS
    assert _judge(_record(CallStatus.SUCCEEDED), window=4.0) is None


def test_reasons_name_the_earlier_call() -> None:
    hazard = judge_repeat(
        _record(CallStatus.OUTCOME_UNKNOWN),
        reconciled=False,
        still_running=False,
        now=NOW,
        window=0.0,
    )
    assert hazard is not None
    assert hazard.reason == (
        "an identical call s/t1/c may have taken effect; its outcome is not reconciled yet"
    )


def test_the_guard_is_on_by_default_for_the_single_attempt_classes_only() -> None:
    settings = Settings()
    for effect in EffectClass:
        snap = resolve_policy(ToolPolicy(effect=effect), None, None, settings)
        assert snap.repeat_guard is (not effect.retryable)
        assert snap.repeat_window == 0.0
    off = resolve_policy(
        ToolPolicy(effect=EffectClass.UNCLASSIFIED, repeat_guard=False), None, None, settings
    )
    on = resolve_policy(
        ToolPolicy(effect=EffectClass.READ, repeat_guard=True, repeat_window=30),
        None,
        None,
        settings,
    )
    assert (off.repeat_guard, on.repeat_guard, on.repeat_window) == (False, True, 30.0)
    with pytest.raises(PolicyError):
        ToolPolicy(repeat_window=-1)


def test_the_snapshot_records_the_guard_and_old_snapshots_stay_readable() -> None:
    snap = resolve_policy(
        ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, repeat_window=60),
        None,
        None,
        Settings(),
    )
    raw = json.loads(snap.to_json())
    assert (raw["repeat_guard"], raw["repeat_window"]) == (True, 60.0)
    assert PolicySnapshot.from_json(snap.to_json()) == snap
    del raw["repeat_guard"], raw["repeat_window"]  # recorded before the guard existed
    old = PolicySnapshot.from_json(json.dumps(raw))
    assert (old.repeat_guard, old.repeat_window) == (False, 0.0)


def test_the_digest_separates_tools_arguments_and_secret_values_but_never_holds_them() -> None:
    key = "k" * 32
    card = secrets_digest({"card": "4111111111111111"}, key)
    assert "4111" not in card and card == secrets_digest({"card": "4111111111111111"}, key)
    assert card != secrets_digest({"card": "5500000000000004"}, key)
    assert card != secrets_digest({"card": "4111111111111111"}, "another key")
    base = repeat_digest("charge", '{"order":"A-1"}', "")
    assert base == repeat_digest("charge", '{"order":"A-1"}', "")
    assert base != repeat_digest("charge", '{"order":"A-2"}', "")
    assert base != repeat_digest("refund", '{"order":"A-1"}', "")
    assert repeat_digest("charge", '{"card":"***"}', card) != repeat_digest(
        "charge", '{"card":"***"}', secrets_digest({"card": "5500"}, key)
    )
    assert secrets_digest({}, None) == ""
    with pytest.raises(SecretKeyMissing):
        secrets_digest({"card": "4111"}, None)
