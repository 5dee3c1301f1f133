"""The effect flags (docs/ledger.md, "Effect flags"): open.lua writes what the scripts need of a
call's class (retry, and what a lost attempt becomes) into its hash, from the class's row of the
effect table (`model/effects.py`); no script names a class. A hash opened by the previous release
has no flags: the scripts then look its class up in the table the caller passes (the expand step
of docs/deploy.md). On fakeredis, a real redis-server and a cluster (the rig of tests/support/stores/ledger_rig.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dex_celery.ledger.ledger import LoseMode, StepKind
from dex_celery.model.effects import (
    EFFECT_TABLE,
    EffectClass,
    EffectTraits,
    ledger_flags_json,
    register_effect_class,
    unregister_effect_class,
)
from dex_celery.model.outcomes import CallStatus
from tests.support.stores.ledger_rig import B0, Rig, claimed, finished

FLAGS = ("retry", "lost", "lost_reason")
SCRIPTS = Path(__file__).parents[3] / "dex_celery" / "ledger" / "scripts"


@pytest.fixture
def probe() -> Iterator[EffectClass]:
    """A class only this test knows: retried, and a lost attempt is failed (as a read)."""
    effect = register_effect_class(
        "probe_effect",
        EffectTraits(
            meaning="a test's own class",
            read_only=True,
            retryable=True,
            fenced=False,
            approval_by_default=False,
            repeat_guard_by_default=False,
            lost_status=CallStatus.FAILED,
        ),
    )
    yield effect
    unregister_effect_class(effect)


def lose(rig: Rig, key: str) -> tuple[StepKind, str, str]:
    step = rig.ledger.lose(key, None, mode=LoseMode.WORKER_LOST, owner="w1", detail="killed")
    return step.kind, step.status, step.reason


def without_flags(rig: Rig, key: str) -> None:
    """The hash as the previous release's open.lua wrote it."""
    rig.client.hdel(rig.keys.of(key).call(key), *FLAGS)


def test_no_script_names_an_effect_class() -> None:
    for script in SCRIPTS.glob("*.lua"):
        text = script.read_text()
        for effect in EffectClass:
            assert f"'{effect.value}'" not in text, (script.name, effect)


@pytest.mark.parametrize("effect", list(EffectClass))
def test_open_writes_the_flags_of_the_class(rig: Rig, effect: EffectClass) -> None:
    key = claimed(rig, effect)
    h = rig.hash(key)
    assert tuple(h[f] for f in FLAGS) == effect.traits.ledger_flags


@pytest.mark.parametrize("effect", list(EffectClass))
@pytest.mark.parametrize("flags", ["in the hash", "from the caller's table"])
def test_a_lost_last_attempt_ends_as_its_row_says(
    rig: Rig, effect: EffectClass, flags: str
) -> None:
    key = claimed(rig, effect, max_attempts=1)
    if flags == "from the caller's table":
        without_flags(rig, key)
    traits = EFFECT_TABLE[effect]
    assert lose(rig, key) == (StepKind.FINISHED, traits.lost_status.value, "lost")


@pytest.mark.parametrize("effect", list(EffectClass))
def test_a_hash_without_flags_is_retried_as_its_row_says(rig: Rig, effect: EffectClass) -> None:
    key = claimed(rig, effect, max_attempts=3 if effect.retryable else 1)
    without_flags(rig, key)
    assert (lose(rig, key)[0] is StepKind.RETRY) == effect.retryable


def test_the_flags_in_the_hash_decide_not_the_class_name(rig: Rig) -> None:
    """A read whose hash says otherwise is treated as the hash says: the scripts read flags."""
    key = claimed(rig, EffectClass.READ, max_attempts=3)
    rig.client.hset(rig.keys.of(key).call(key), mapping={"retry": "0", "lost": "outcome_unknown"})
    assert lose(rig, key) == (StepKind.FINISHED, "outcome_unknown", "lost")


def test_a_class_neither_hash_nor_table_knows_runs_once_with_its_outcome_unknown(rig: Rig) -> None:
    key = claimed(rig, EffectClass.READ, max_attempts=3)
    without_flags(rig, key)
    rig.client.hset(rig.keys.of(key).call(key), "effect", "from_a_later_release")
    assert lose(rig, key) == (StepKind.FINISHED, "outcome_unknown", "lost")


def test_a_registered_class_is_in_the_table_the_scripts_get(probe: EffectClass) -> None:
    assert json.loads(ledger_flags_json())[probe.value] == ["1", "failed", "lost"]


@pytest.mark.parametrize("flags", ["in the hash", "from the caller's table"])
def test_a_registered_class_follows_its_row(rig: Rig, probe: EffectClass, flags: str) -> None:
    key = claimed(rig, probe, max_attempts=2)
    if flags == "from the caller's table":
        without_flags(rig, key)
    assert lose(rig, key)[0] is StepKind.RETRY
    rig.knobs.advance(B0)  # past the backoff (at most B0), within schedule-to-start
    assert rig.ledger.claim(key, 2, owner="w1", fence="f2").ok
    step = rig.ledger.lose(key, None, mode=LoseMode.WORKER_LOST, owner="w1", detail="killed")
    finished(step, "failed", "lost", attempt=2)
