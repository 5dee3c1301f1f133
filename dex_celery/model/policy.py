"""Tool policies (S1): approval defaults, precedence and the recorded snapshot.

What each effect class means is its row of the one table, `model/effects.py`.

A `ToolPolicy` is what a tool author declares; a `PolicySnapshot` is what applied to one call
when it was requested (S1.5). Only the snapshot is consulted after the request, so changing a
tool's policy never changes a call already recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from functools import lru_cache
from typing import Any, Protocol

from dex_celery.errors import PolicyError
from dex_celery.model.budgets import Budget
from dex_celery.model.effects import UNDECLARED_EFFECT, traits_of

# `EffectClass` is re-exported: it is the type of `ToolPolicy.effect`.
from dex_celery.model.effects import EffectClass as EffectClass


class PolicyDefaults(Protocol):
    """The deployment-wide defaults a policy falls back to: `Settings` has them all.

    Declared here rather than imported, so the model sits below the settings that use it
    (docs/architecture.md, "The layers"): `settings.py` reads budgets and durations from
    `model/`, and nothing in `model/` reads `settings.py`.
    """

    @property
    def max_attempts(self) -> int: ...
    @property
    def backoff_initial(self) -> float: ...
    @property
    def backoff_max(self) -> float: ...
    @property
    def schedule_to_start(self) -> float: ...
    @property
    def start_to_close(self) -> float: ...
    @property
    def heartbeat_timeout(self) -> float: ...
    @property
    def approval_timeout(self) -> float: ...


class EffectSource(StrEnum):
    """Where a call's effect class came from, kept in the snapshot for people reading it."""

    POLICY = "policy"
    TOOL_METADATA = "tool_metadata"
    SESSION_DEFAULT = "session_default"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """What a tool author declares. Unset fields fall back to metadata, then to `Settings`.

    `secret_arguments` names argument keys whose values never reach Flower or logs (S9.2).

    Attributes:
        effect: What the tool does (`read`, `idempotent_write`, `non_idempotent_write`,
            `unclassified`); decides retries and the approval default. Unset: the tool's
            framework metadata (MCP annotations), then the session's default effect.
        requires_approval: True asks a person before every call; False lets a write run
            without one (still at most once); unset: the class's default.
        max_attempts: Attempts of a `read` / `idempotent_write` call (others get one).
        backoff_initial: First retry delay in seconds; doubled per attempt, with jitter.
        backoff_max: Cap of the retry delay in seconds.
        schedule_to_start: Seconds an attempt may wait in the queue before a worker claims it.
        start_to_close: Seconds an attempt may run before it is cancelled and recorded failed.
        heartbeat_timeout: Seconds a running attempt's lease lasts without a heartbeat.
        approval_timeout: Seconds a call may wait for a decision before it is rejected.
        secret_arguments: Argument names whose values are redacted in every output.
        repeat_guard: True makes a call identical to an earlier one of the session that may
            still be running or may have taken effect wait for a person (S5.4); unset: on for
            `non_idempotent_write` and `unclassified`, off for the retried classes.
        repeat_window: Seconds after a `succeeded` call within which an identical call of the
            session also waits for a person (S5.4); unset or 0: off.
        budgets: Write budgets the tool's calls draw on (S13.1, `model/budgets.py`); tools
            declaring a budget of the same name share it.
    """

    effect: EffectClass | None = None
    requires_approval: bool | None = None
    max_attempts: int | None = None
    backoff_initial: float | None = None
    backoff_max: float | None = None
    schedule_to_start: float | None = None
    start_to_close: float | None = None
    heartbeat_timeout: float | None = None
    approval_timeout: float | None = None
    secret_arguments: tuple[str, ...] = ()
    repeat_guard: bool | None = None
    repeat_window: float | None = None
    budgets: tuple[Budget, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.budgets, Budget):
            object.__setattr__(self, "budgets", (self.budgets,))
        if self.effect is not None:
            object.__setattr__(self, "effect", EffectClass.parse(self.effect))
        if self.max_attempts is not None and self.max_attempts < 1:
            raise PolicyError(f"max_attempts must be at least 1, got {self.max_attempts}")
        for name in (
            "backoff_initial",
            "backoff_max",
            "schedule_to_start",
            "start_to_close",
            "heartbeat_timeout",
            "approval_timeout",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise PolicyError(f"{name} must be positive, got {value!r}")
        if self.repeat_window is not None and self.repeat_window < 0:
            raise PolicyError(f"repeat_window must not be negative, got {self.repeat_window!r}")
        if isinstance(self.secret_arguments, str):
            raise PolicyError("secret_arguments must be a tuple of argument names, not a string")


def effect_from_annotations(annotations: Mapping[str, Any] | None) -> EffectClass | None:
    """MCP tool annotations to an effect class, or None when the tool carries no hints (S1.4).

    `readOnlyHint` → read; `idempotentHint` (not read-only) → idempotent_write; hints present
    but neither → non_idempotent_write.
    """
    if not annotations:
        return None
    hints = ("readOnlyHint", "idempotentHint", "destructiveHint", "openWorldHint")
    if not any(h in annotations for h in hints):
        return None
    if annotations.get("readOnlyHint") is True:
        return EffectClass.READ
    if annotations.get("idempotentHint") is True:
        return EffectClass.IDEMPOTENT_WRITE
    return EffectClass.NON_IDEMPOTENT_WRITE


def approval_by_default(effect: EffectClass, annotations: Mapping[str, Any] | None) -> bool:
    """S1.3: whether a call waits for a person when its policy does not say.

    The class's default, and also any write whose metadata says `destructiveHint: true` (MCP's
    default when the hint is missing): an idempotent overwrite or delete is safe to retry, but
    running it with nobody asked is not. The class still decides retries.
    """
    if effect.approval_by_default:
        return True
    return not traits_of(effect).read_only and bool(
        annotations and annotations.get("destructiveHint") is True
    )


def declared_effect(
    policy: ToolPolicy, annotations: Mapping[str, Any] | None
) -> EffectClass | None:
    """The class a tool declares itself (S1.4): its policy, then its metadata; None when only
    a session default could say."""
    return policy.effect or effect_from_annotations(annotations)


def check_registration(
    name: str, policy: ToolPolicy, annotations: Mapping[str, Any] | None
) -> None:
    """S1.6: asking for retries of a single-attempt class is a configuration error."""
    effect = declared_effect(policy, annotations)
    if effect is not None and not effect.retryable and (policy.max_attempts or 1) > 1:
        raise PolicyError(
            f"tool {name!r} is {effect.value} but asks for max_attempts={policy.max_attempts}; "
            "a call that may repeat its effect runs at most once (S1.6, S3.2). Make the tool "
            "idempotent (pass the idempotency key to the service) and declare idempotent_write."
        )


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """The rules that applied to one call when it was requested (S1.5)."""

    effect: EffectClass
    effect_source: EffectSource
    requires_approval: bool
    max_attempts: int
    backoff_initial: float
    backoff_max: float
    schedule_to_start: float
    start_to_close: float
    heartbeat_timeout: float
    approval_timeout: float
    secret_arguments: tuple[str, ...]
    #: The repeat guard (S5.4). Defaults keep snapshots recorded before it readable: a call
    #: recorded then was never guarded.
    repeat_guard: bool = False
    repeat_window: float = 0.0

    def to_json(self) -> str:
        # The field types are part of the key: 1 == 1.0 == True, but their JSON differs.
        return _snapshot_json(self, tuple(type(getattr(self, f)) for f in _FIELDS))

    @classmethod
    def from_json(cls, text: str) -> PolicySnapshot:
        return _snapshot_of(text)


# A deployment has a handful of distinct snapshots (one per tool and session default), and every
# request writes one and reads it back: both directions are cached. Snapshots are frozen, so the
# one object a text maps to can be shared.
_FIELDS = tuple(f.name for f in fields(PolicySnapshot))


@lru_cache(maxsize=1024)
def _snapshot_json(snapshot: PolicySnapshot, _types: tuple[type, ...]) -> str:
    return json.dumps(asdict(snapshot), sort_keys=True)


@lru_cache(maxsize=1024)
def _snapshot_of(text: str) -> PolicySnapshot:
    raw = json.loads(text)
    raw["effect"] = EffectClass.parse(raw["effect"])
    raw["effect_source"] = EffectSource(raw["effect_source"])
    raw["secret_arguments"] = tuple(raw["secret_arguments"])
    return PolicySnapshot(**raw)


def resolve_policy(
    policy: ToolPolicy | None,
    annotations: Mapping[str, Any] | None,
    session_default: EffectClass | None,
    settings: PolicyDefaults,
) -> PolicySnapshot:
    """Apply S1.3 and S1.4: explicit policy, then tool metadata, then the session default."""
    policy = policy or ToolPolicy()
    metadata_effect = effect_from_annotations(annotations)
    if policy.effect is not None:
        effect, source = policy.effect, EffectSource.POLICY
    elif metadata_effect is not None:
        effect, source = metadata_effect, EffectSource.TOOL_METADATA
    elif session_default is not None:
        effect, source = EffectClass.parse(session_default), EffectSource.SESSION_DEFAULT
    else:
        effect, source = UNDECLARED_EFFECT, EffectSource.NONE
    requires_approval = (
        approval_by_default(effect, annotations)
        if policy.requires_approval is None
        else policy.requires_approval
    )
    # A single-attempt class never gets a second attempt, whatever else was asked (S3.2).
    max_attempts = (policy.max_attempts or settings.max_attempts) if effect.retryable else 1
    return PolicySnapshot(
        effect=effect,
        effect_source=source,
        requires_approval=requires_approval,
        max_attempts=max_attempts,
        backoff_initial=policy.backoff_initial or settings.backoff_initial,
        backoff_max=policy.backoff_max or settings.backoff_max,
        schedule_to_start=policy.schedule_to_start or settings.schedule_to_start,
        start_to_close=policy.start_to_close or settings.start_to_close,
        heartbeat_timeout=policy.heartbeat_timeout or settings.heartbeat_timeout,
        approval_timeout=policy.approval_timeout or settings.approval_timeout,
        secret_arguments=policy.secret_arguments,
        repeat_guard=(
            effect.traits.repeat_guard_by_default
            if policy.repeat_guard is None
            else policy.repeat_guard
        ),
        repeat_window=float(policy.repeat_window or 0.0),
    )
