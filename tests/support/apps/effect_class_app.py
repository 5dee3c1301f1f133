"""A deployment that adds an effect class of its own: one row of the effect table
(`dex_celery/model/effects.py`) and nothing else, to show every part of the system follows it.

`once_then_failed` is a combination no class of S1.2 has: run at most once and fenced (a claim
committed in SQL before any tool code), yet a lost attempt ends `failed`, not `outcome_unknown`.
`retried_unfenced` is retried and keeps a Redis-only claim.

Its worker runs `celery -A tests.support.apps.effect_class_worker:app worker`, a module that
registers the classes at import (every process of a deployment must). The test process
registers them with `register_classes` for the test's length only and builds its requester with
`make_app`. The worker announces readiness like the test tools' app (`devtools.toolapp`'s
`worker_ready` hook, imported here).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from devtools.toolapp import log_dir, log_file
from dex_celery import Dex, RetryableToolError, Settings, ToolContext, ToolPolicy
from dex_celery.model.effects import (
    EffectClass,
    EffectTraits,
    register_effect_class,
    unregister_effect_class,
)
from dex_celery.model.outcomes import CallStatus

ONCE = "once_then_failed"
RETRIED = "retried_unfenced"

TRAITS = {
    ONCE: EffectTraits(
        meaning="changes something once; a lost attempt is failed",
        read_only=False,
        retryable=False,
        fenced=True,
        approval_by_default=False,
        repeat_guard_by_default=False,
        lost_status=CallStatus.FAILED,
    ),
    RETRIED: EffectTraits(
        meaning="changes something, safely repeated; retried",
        read_only=False,
        retryable=True,
        fenced=False,
        approval_by_default=False,
        repeat_guard_by_default=False,
        lost_status=CallStatus.OUTCOME_UNKNOWN,
    ),
}


def register_classes() -> dict[str, EffectClass]:
    return {name: register_effect_class(name, traits) for name, traits in TRAITS.items()}


def unregister_classes(classes: dict[str, EffectClass]) -> None:
    for effect in classes.values():
        unregister_effect_class(effect)


def _note(ctx: ToolContext, what: str) -> None:
    """The test tools' log line (`devtools.toolapp.executions`): `start <attempt> <pid> <key>`."""
    with log_file(ctx.idempotency_key).open("a") as f:
        f.write(f"{what} {ctx.attempt} {os.getpid()} {ctx.idempotency_key}\n")


def make_app(
    classes: dict[str, EffectClass], settings: Settings | None = None
) -> tuple[Celery, Dex]:
    app = Celery("dex_effect_class_tools")
    dex = Dex(app, settings or Settings.from_env())

    for name, effect in classes.items():
        policy = ToolPolicy(effect=effect, max_attempts=3 if effect.retryable else None)

        @dex.tool(name=f"flaky_{name}", policy=policy)
        def flaky(ctx: ToolContext) -> Any:
            """Fails with a retryable error on attempt 1, then succeeds."""
            _note(ctx, "start")
            if ctx.attempt == 1:
                raise RetryableToolError("the service was busy")
            return {"attempt": ctx.attempt}

        @dex.tool(name=f"held_{name}", policy=policy)
        def held(ctx: ToolContext) -> Any:
            """Runs until the test drops `<log>/release` (the test kills it before)."""
            _note(ctx, "start")
            release = log_dir() / "release"
            while not release.exists():
                time.sleep(0.05)
            return "released"

    return app, dex
