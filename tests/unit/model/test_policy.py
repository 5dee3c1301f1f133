"""Tool policies (S1): effect classes, approval defaults, precedence, snapshots, registration."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery

from dex_celery import Dex, PolicyError, Settings, ToolContext, UnknownEffectClass
from dex_celery.model.policy import (
    EffectClass,
    EffectSource,
    PolicySnapshot,
    ToolPolicy,
    check_registration,
    effect_from_annotations,
    resolve_policy,
)

# Celery registers `app.task` tasks in every app of the process (shared=True), so each new Dex
# warns that `dex.sweep` exists already; that is reported to the lead, not tested here.
pytestmark = pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")

SETTINGS = Settings(max_attempts=4, backoff_initial=0.25, backoff_max=9.0)


def resolve(
    policy: ToolPolicy | None = None,
    annotations: dict[str, Any] | None = None,
    session_default: EffectClass | None = None,
) -> PolicySnapshot:
    return resolve_policy(policy, annotations, session_default, SETTINGS)


# --- S1.2 ------------------------------------------------------------------------------------


def test_the_four_effect_classes_have_exactly_these_strings() -> None:
    """S1.2: the exact string values."""
    assert [c.value for c in EffectClass] == [
        "read",
        "idempotent_write",
        "non_idempotent_write",
        "unclassified",
    ]
    for c in EffectClass:
        assert EffectClass.parse(c.value) is c
        assert EffectClass.parse(c) is c


@pytest.mark.parametrize(
    "value", ["READ", "Read", " read", "write", "idempotent-write", "", "readonly", "None"]
)
def test_any_other_string_is_an_unknown_effect_class(value: str) -> None:
    """S1.2, S9.3: only the exact strings; anything else is a typed error naming the choices."""
    with pytest.raises(UnknownEffectClass, match="expected one of: read, idempotent_write"):
        EffectClass.parse(value)


def test_an_unknown_effect_class_in_a_tool_policy_is_refused() -> None:
    """S9.3: a ToolPolicy built from configuration strings refuses a wrong class at once."""
    with pytest.raises(UnknownEffectClass):
        ToolPolicy(effect="destructive")  # type: ignore[arg-type]
    assert ToolPolicy(effect="read").effect is EffectClass.READ  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("effect", "retried"),
    [
        (EffectClass.READ, True),
        (EffectClass.IDEMPOTENT_WRITE, True),
        (EffectClass.NON_IDEMPOTENT_WRITE, False),
        (EffectClass.UNCLASSIFIED, False),
    ],
)
def test_how_each_class_runs(effect: EffectClass, retried: bool) -> None:
    """S1.2, S3.1, S3.2: reads and idempotent writes are retried; the others run once."""
    assert effect.retryable is retried
    snap = resolve(ToolPolicy(effect=effect))
    assert snap.max_attempts == (SETTINGS.max_attempts if retried else 1)


@pytest.mark.parametrize("effect", [EffectClass.NON_IDEMPOTENT_WRITE, EffectClass.UNCLASSIFIED])
def test_single_attempt_classes_always_get_one_attempt(effect: EffectClass) -> None:
    """S3.2: whatever the settings, metadata or session say, one attempt."""
    assert resolve(ToolPolicy(effect=effect, requires_approval=False)).max_attempts == 1
    assert resolve(None, None, effect).max_attempts == 1
    assert resolve_policy(None, None, None, Settings(max_attempts=9)).max_attempts == 1


def test_retryable_classes_take_the_policys_attempts_over_the_settings() -> None:
    assert resolve(ToolPolicy(effect=EffectClass.READ, max_attempts=7)).max_attempts == 7
    assert resolve(ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE)).max_attempts == 4


# --- S1.3 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("effect", "default"),
    [
        (EffectClass.READ, False),
        (EffectClass.IDEMPOTENT_WRITE, False),
        (EffectClass.NON_IDEMPOTENT_WRITE, True),
        (EffectClass.UNCLASSIFIED, True),
    ],
)
def test_approval_defaults_and_overrides(effect: EffectClass, default: bool) -> None:
    """S1.3: default by class; True asks every time; False lets it run without asking."""
    assert effect.approval_by_default is default
    assert resolve(ToolPolicy(effect=effect)).requires_approval is default
    assert resolve(ToolPolicy(effect=effect, requires_approval=True)).requires_approval is True
    assert resolve(ToolPolicy(effect=effect, requires_approval=False)).requires_approval is False


def test_no_approval_does_not_make_a_write_retried() -> None:
    """S1.3: a non-idempotent write that runs without approval still runs at most once."""
    snap = resolve(ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False))
    assert (snap.requires_approval, snap.max_attempts) == (False, 1)


# --- S1.4 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"readOnlyHint": True}, EffectClass.READ),
        ({"readOnlyHint": True, "destructiveHint": True}, EffectClass.READ),
        ({"idempotentHint": True}, EffectClass.IDEMPOTENT_WRITE),
        ({"readOnlyHint": False, "idempotentHint": True}, EffectClass.IDEMPOTENT_WRITE),
        ({"destructiveHint": True}, EffectClass.NON_IDEMPOTENT_WRITE),
        ({"destructiveHint": False}, EffectClass.NON_IDEMPOTENT_WRITE),
        ({"readOnlyHint": False}, EffectClass.NON_IDEMPOTENT_WRITE),
        ({"idempotentHint": False, "destructiveHint": True}, EffectClass.NON_IDEMPOTENT_WRITE),
        ({"openWorldHint": True}, EffectClass.NON_IDEMPOTENT_WRITE),
        ({}, None),
        (None, None),
        ({"title": "Cancel order"}, None),
    ],
)
def test_mcp_annotations_map_to_effect_classes(
    annotations: dict[str, Any] | None, expected: EffectClass | None
) -> None:
    """S1.4: readOnlyHint -> read, idempotentHint -> idempotent_write, other hints -> a write
    that may repeat its effect; no hints -> no metadata."""
    assert effect_from_annotations(annotations) is expected


def test_precedence_policy_then_metadata_then_session_default_then_unclassified() -> None:
    """S1.4: explicit policy > framework metadata > session default > unclassified."""
    read_hint = {"readOnlyHint": True}
    write_default = EffectClass.NON_IDEMPOTENT_WRITE
    snap = resolve(ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE), read_hint, write_default)
    assert (snap.effect, snap.effect_source) == (EffectClass.IDEMPOTENT_WRITE, EffectSource.POLICY)
    snap = resolve(ToolPolicy(requires_approval=True), read_hint, write_default)
    assert (snap.effect, snap.effect_source) == (EffectClass.READ, EffectSource.TOOL_METADATA)
    assert snap.requires_approval is True  # the policy's approval rule still applies
    snap = resolve(ToolPolicy(), {"title": "no hints"}, write_default)
    assert (snap.effect, snap.effect_source) == (write_default, EffectSource.SESSION_DEFAULT)
    snap = resolve(None, None, None)
    assert (snap.effect, snap.effect_source) == (EffectClass.UNCLASSIFIED, EffectSource.NONE)
    assert (snap.requires_approval, snap.max_attempts) == (True, 1)


def test_a_session_default_given_as_a_string_is_parsed_strictly() -> None:
    """S1.4, S9.3: the session default goes through the same strict parser."""
    assert resolve(None, None, "read").effect is EffectClass.READ  # type: ignore[arg-type]
    with pytest.raises(UnknownEffectClass):
        resolve(None, None, "reads")  # type: ignore[arg-type]


# --- S1.5 ------------------------------------------------------------------------------------


def test_snapshot_round_trips_through_json() -> None:
    """S1.5: the call record keeps what applied when it was requested, exactly."""
    snap = resolve(
        ToolPolicy(
            effect=EffectClass.IDEMPOTENT_WRITE,
            requires_approval=True,
            max_attempts=5,
            backoff_initial=0.1,
            backoff_max=2.5,
            schedule_to_start=7.0,
            start_to_close=11.0,
            heartbeat_timeout=1.5,
            approval_timeout=99.0,
            secret_arguments=("token", "card"),
        )
    )
    again = PolicySnapshot.from_json(snap.to_json())
    assert again == snap
    assert isinstance(again.effect, EffectClass)
    assert isinstance(again.effect_source, EffectSource)
    assert again.secret_arguments == ("token", "card")


def test_unset_limits_come_from_settings() -> None:
    snap = resolve(ToolPolicy(effect=EffectClass.READ))
    assert (snap.backoff_initial, snap.backoff_max) == (0.25, 9.0)
    assert snap.schedule_to_start == SETTINGS.schedule_to_start
    assert snap.start_to_close == SETTINGS.start_to_close
    assert snap.heartbeat_timeout == SETTINGS.heartbeat_timeout
    assert snap.approval_timeout == SETTINGS.approval_timeout


def test_a_snapshot_with_an_unknown_class_is_refused() -> None:
    """S9.3: a corrupted record does not silently become some other class."""
    text = resolve(ToolPolicy(effect=EffectClass.READ)).to_json().replace('"read"', '"reed"')
    with pytest.raises(UnknownEffectClass):
        PolicySnapshot.from_json(text)


# --- S1.6 ------------------------------------------------------------------------------------


@pytest.fixture
def dex() -> Dex:
    return Dex(Celery(f"policy_test_{uuid.uuid4().hex}"), Settings())


def _tool(ctx: ToolContext) -> None:
    return None


@pytest.mark.parametrize("effect", [EffectClass.NON_IDEMPOTENT_WRITE, EffectClass.UNCLASSIFIED])
def test_retries_of_a_single_attempt_class_fail_registration(dex: Dex, effect: EffectClass) -> None:
    """S1.6: reported when the tool is registered, and nothing is registered."""
    name = f"bad_{effect.value}"
    with pytest.raises(PolicyError, match="runs at most once"):
        dex.tool(name, policy=ToolPolicy(effect=effect, max_attempts=2))(_tool)
    assert name not in dex.tools
    assert f"dex.tool.{name}" not in dex.celery.tasks


def test_retries_asked_of_a_tool_whose_metadata_says_destructive_fail_registration(
    dex: Dex,
) -> None:
    """S1.4, S1.6: the class from MCP metadata counts too."""
    with pytest.raises(PolicyError):
        dex.tool(
            "destroy", policy=ToolPolicy(max_attempts=3), annotations={"destructiveHint": True}
        )(_tool)


@pytest.mark.parametrize("effect", [EffectClass.READ, EffectClass.IDEMPOTENT_WRITE])
def test_retries_of_a_retryable_class_register(dex: Dex, effect: EffectClass) -> None:
    name = f"ok_{effect.value}"
    dex.tool(name, policy=ToolPolicy(effect=effect, max_attempts=5))(_tool)
    assert dex.tools[name].policy.max_attempts == 5
    assert f"dex.tool.{name}" in dex.celery.tasks


def test_one_attempt_of_a_single_attempt_class_registers() -> None:
    check_registration(
        "w", ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, max_attempts=1), None
    )
    check_registration("u", ToolPolicy(), None)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"backoff_initial": 0},
        {"backoff_max": -1.0},
        {"schedule_to_start": 0},
        {"start_to_close": -5},
        {"heartbeat_timeout": 0},
        {"approval_timeout": 0},
        {"secret_arguments": "token"},
    ],
)
def test_nonsense_limits_are_policy_errors(kwargs: dict[str, Any]) -> None:
    """S1.1, S9.3: limits must make sense; a string is not a tuple of argument names."""
    with pytest.raises(PolicyError):
        ToolPolicy(**kwargs)


@pytest.mark.parametrize(
    ("policy", "annotations"),
    [
        (ToolPolicy(effect=EffectClass.READ), None),
        (ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE), None),
        (ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE), None),
        (ToolPolicy(effect=EffectClass.UNCLASSIFIED), None),
        (ToolPolicy(), {"readOnlyHint": True}),
        (ToolPolicy(), {"destructiveHint": True}),
        (ToolPolicy(), None),
    ],
)
def test_celery_options_are_the_same_for_every_effect_class(
    dex: Dex, policy: ToolPolicy, annotations: dict[str, bool] | None
) -> None:
    """docs/ledger.md, "Celery options": every tool task is acknowledged late, whatever its
    class, so a running attempt holds its slot's prefetch (a worker never holds a call it has no
    free slot for) and an unclaimed message can be handed back; a redelivered copy is refused by
    its claim (S3.2, S3.3). Never requeued on a lost worker (the ledger decides retries)."""
    dex.tool("t", policy=policy, annotations=annotations)(lambda ctx: None)
    task = dex.celery.tasks["dex.tool.t"]
    assert task.acks_late is True
    assert task.reject_on_worker_lost is False
    assert task.ignore_result is True


def test_cached_snapshot_json_keeps_each_snapshots_own_text() -> None:
    """The JSON of snapshots is cached (`policy._snapshot_json`); equal snapshots whose values
    differ in type (1 and 1.0) still get their own text, so what SQL stores is unchanged."""
    whole = resolve(ToolPolicy(effect=EffectClass.READ, backoff_initial=1))
    fractional = resolve(ToolPolicy(effect=EffectClass.READ, backoff_initial=1.0))
    assert whole == fractional
    assert '"backoff_initial": 1,' in whole.to_json()
    assert '"backoff_initial": 1.0,' in fractional.to_json()
    assert whole.to_json() == whole.to_json()
    assert PolicySnapshot.from_json(whole.to_json()) is PolicySnapshot.from_json(whole.to_json())
