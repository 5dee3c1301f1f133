"""The effect table (`dex_celery/model/effects.py`): one row per class, the one place a class's
meaning lives; a class registered in it alone is honoured by policy resolution, MCP hints and
the ledger's flags. (Its ledger scripts: tests/unit/ledger/test_effect_flags.py; a real worker:
tests/crash/worker/test_new_effect_class.py.)"""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Iterator

import pytest
from celery import Celery

from dex_celery import Dex, PolicyError, Settings, ToolContext, UnknownEffectClass
from dex_celery.model.effects import (
    EFFECT_TABLE,
    EffectClass,
    EffectTraits,
    fenced_classes,
    ledger_flags_json,
    register_effect_class,
    traits_of,
    unregister_effect_class,
)
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import ToolPolicy, resolve_policy
from dex_celery.tools.definitions import mcp_hints

pytestmark = pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")


def traits(**changes: object) -> EffectTraits:
    row: dict[str, object] = {
        "meaning": "a test's own class",
        "read_only": False,
        "retryable": False,
        "fenced": True,
        "approval_by_default": False,
        "repeat_guard_by_default": True,
        "lost_status": CallStatus.FAILED,
        "mcp_hints": {"readOnlyHint": False, "destructiveHint": False},
    }
    return EffectTraits(**{**row, **changes})  # type: ignore[arg-type]


@pytest.fixture
def probe() -> Iterator[EffectClass]:
    effect = register_effect_class("probe_effect", traits())
    yield effect
    unregister_effect_class(effect)


def test_every_class_has_one_row() -> None:
    assert list(EFFECT_TABLE) == list(EffectClass)
    assert len(EffectClass) == 4


def test_the_rows_say_s1_s3_and_s4() -> None:
    """S1.3 approval, S3.1/S3.2 retries, the write fence, S4.3 a lost attempt, S5.4 the guard."""
    read, idem, write, unclassified = (EFFECT_TABLE[c] for c in EffectClass)
    assert [t.retryable for t in (read, idem, write, unclassified)] == [True, True, False, False]
    assert fenced_classes() == (EffectClass.NON_IDEMPOTENT_WRITE, EffectClass.UNCLASSIFIED)
    assert [t.lost_status for t in (read, idem, write, unclassified)] == [
        CallStatus.FAILED,
        *[CallStatus.OUTCOME_UNKNOWN] * 3,
    ]
    for t in EFFECT_TABLE.values():
        assert t.approval_by_default is t.repeat_guard_by_default is not t.retryable
    assert [c for c, t in EFFECT_TABLE.items() if t.read_only] == [EffectClass.READ]
    assert dict(unclassified.mcp_hints) == {}


def test_a_class_is_its_string_and_stays_itself_when_copied() -> None:
    for c in EffectClass:
        assert EffectClass(c.value) is c and c == c.value and str(c) == c.value
        assert copy.deepcopy(c) is c and pickle.loads(pickle.dumps(c)) is c
        assert json.dumps({"effect": c}) == json.dumps({"effect": c.value})
    assert repr(EffectClass.READ) == "EffectClass('read')"


def test_an_unknown_value_is_a_typed_error_and_stored_unknown_values_count_as_unclassified() -> (
    None
):
    with pytest.raises(UnknownEffectClass, match="expected one of: read, idempotent_write"):
        EffectClass("destructive")
    assert traits_of("from_a_later_release") is EFFECT_TABLE[EffectClass.UNCLASSIFIED]
    assert traits_of("read") is EFFECT_TABLE[EffectClass.READ]


@pytest.mark.parametrize(
    "changes",
    [
        {"retryable": True},  # retried yet fenced: SQL holds one claim per call
        {"lost_status": CallStatus.SUCCEEDED},
        {"read_only": True},  # its readOnlyHint says otherwise
    ],
)
def test_a_row_that_contradicts_itself_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(PolicyError):
        traits(**changes)


def test_a_registered_class_is_parsed_listed_and_flagged(probe: EffectClass) -> None:
    assert EffectClass.parse("probe_effect") is probe
    assert ToolPolicy(effect="probe_effect").effect is probe  # type: ignore[arg-type]
    assert list(EffectClass)[-1] is probe
    assert probe in fenced_classes()
    assert json.loads(ledger_flags_json())["probe_effect"] == ["0", "failed", "lost"]


def test_a_registered_class_is_gone_once_unregistered() -> None:
    effect = register_effect_class("probe_effect", traits())
    unregister_effect_class(effect)
    assert "probe_effect" not in json.loads(ledger_flags_json())
    with pytest.raises(UnknownEffectClass):
        EffectClass.parse("probe_effect")


def test_a_class_registers_once_and_s1_2s_stay() -> None:
    with pytest.raises(PolicyError):
        register_effect_class("read", traits())
    with pytest.raises(PolicyError):
        unregister_effect_class(EffectClass.READ)


def test_policy_resolution_and_mcp_hints_follow_a_registered_row(probe: EffectClass) -> None:
    snapshot = resolve_policy(
        ToolPolicy(effect=probe), None, None, Settings(max_attempts=4, backoff_initial=0.1)
    )
    assert (snapshot.max_attempts, snapshot.requires_approval, snapshot.repeat_guard) == (
        1,
        False,
        True,
    )
    dex = Dex(Celery("probe"), Settings())

    @dex.tool(policy=ToolPolicy(effect=probe))
    def probe_tool(ctx: ToolContext) -> None:
        """A tool of the test's class."""

    assert mcp_hints(dex.get_tool("probe_tool")) == {
        "readOnlyHint": False,
        "destructiveHint": False,
    }
