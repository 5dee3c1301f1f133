"""What watches every attempt, as hooks on its phases (`engine/attempt/phases.py`), in order.

`attempt_hooks` is the one list. Its order is the order of today's behaviour: a pause point
comes before the span of the phase it opens and after the span of the one it closes (a process
held at `tool_started` has not opened `dex.attempt.run`), and the Flower REFUSED event is sent
once the claim's span is closed. A new concern that watches attempts (a metric, a log line per
phase) is one more hook here, not a line in `Worker.run` (docs/architecture.md).
"""

from __future__ import annotations

from celery import current_task

from dex_celery.engine import tracing
from dex_celery.engine.attempt.pause_points import PausePoint, pause_at
from dex_celery.engine.attempt.phases import AttemptContext, Phase, PhaseHook
from dex_celery.engine.task_events import refuse_delivery
from dex_celery.engine.tracing import span
from dex_celery.settings import Settings


class PausePoints:
    """The crash tests' named points (`engine/attempt/pause_points.py`) on phase boundaries:
    `before_claim` entering ADMIT (nothing claimed), `tool_started` entering RUN (claimed,
    fenced, the lease renewed by the pump), `after_tool` entering FINISH after the tool ran (the
    pump no longer renews its lease; the ledger not yet told). `in_tool` is the tool's own,
    `before_hold` the hand-over of a claim a write freeze refused (`Worker._frozen`), and
    `before_record` the outcome writer's."""

    enters: frozenset[Phase] = frozenset({Phase.ADMIT, Phase.RUN, Phase.FINISH})
    exits: frozenset[Phase] = frozenset()

    def watching(self) -> bool:
        return True  # each point reads its own switch (`pause_at`: a cached set, no I/O)

    def enter(self, phase: Phase, ctx: AttemptContext) -> object:
        if phase is Phase.ADMIT:
            pause_at(PausePoint.BEFORE_CLAIM, ctx.key)
        elif phase is Phase.RUN:
            pause_at(PausePoint.TOOL_STARTED, ctx.key)
        elif ctx.cause is not None:  # FINISH of a tool that ran (not of a claim short of replicas)
            pause_at(PausePoint.AFTER_TOOL, ctx.key)
        return None

    def exit(
        self, phase: Phase, ctx: AttemptContext, token: object, error: BaseException | None
    ) -> None:
        return None


#: The span of each phase that has one (ADMIT has none: its claim does).
_SPANS = {
    Phase.ATTEMPT: tracing.ATTEMPT,
    Phase.CLAIM: tracing.CLAIM,
    Phase.RUN: tracing.RUN,
    Phase.FINISH: tracing.FINISH,
}


class Tracing:
    """A span per phase (`engine/tracing.py`): `dex.attempt`, a child of the request's span
    (the message's trace context), and inside it `dex.attempt.claim`, `.run` and `.finish`.
    What a phase learned is set on its span as it closes: the run's `dex.cause`, the finish's
    `dex.step`; the attempt's session, effect class and `dex.outcome`. An exception leaving a
    phase is recorded on its span. Nothing is opened while tracing is off."""

    enters: frozenset[Phase] = frozenset(_SPANS)
    exits: frozenset[Phase] = frozenset(_SPANS)

    def __init__(self, web_base_url: str | None) -> None:
        self.web_base_url = web_base_url

    def watching(self) -> bool:
        return tracing.enabled()

    def enter(self, phase: Phase, ctx: AttemptContext) -> object:
        if phase is Phase.ATTEMPT:
            # The message's trace context: this attempt's span continues the request's trace.
            parent = tracing.from_request(getattr(current_task, "request", None))
            opened = span(_SPANS[phase], parent, key=ctx.key, attempt=ctx.attempt, tool=ctx.tool)
        else:
            opened = span(_SPANS[phase], key=ctx.key, attempt=ctx.attempt)
        return opened, opened.__enter__()

    def exit(
        self, phase: Phase, ctx: AttemptContext, token: object, error: BaseException | None
    ) -> None:
        if not isinstance(token, tuple):  # no span was opened
            return
        opened, live = token
        if phase is Phase.ATTEMPT:
            if ctx.session is not None:
                tracing.name_session(live, ctx.session, self.web_base_url)
            live.set("effect", ctx.effect)
            live.set("outcome", ctx.outcome)
        elif phase is Phase.RUN:
            live.set("cause", ctx.cause)
        elif phase is Phase.FINISH:
            live.set("step", ctx.step)
        if error is None:
            opened.__exit__(None, None, None)
        else:
            opened.__exit__(type(error), error, error.__traceback__)


class TaskEvents:
    """Flower's REFUSED state for a delivery whose claim was refused (`engine/task_events.py`),
    sent as ADMIT ends. The attempt's other states are its task's result: the worker returns the
    record's summary or raises `AttemptFailed` or `Retry`, and Celery sends the event."""

    enters: frozenset[Phase] = frozenset()
    exits: frozenset[Phase] = frozenset({Phase.ADMIT})

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def watching(self) -> bool:
        return self.settings.task_events

    def enter(self, phase: Phase, ctx: AttemptContext) -> object:
        return None

    def exit(
        self, phase: Phase, ctx: AttemptContext, token: object, error: BaseException | None
    ) -> None:
        if ctx.refused is not None:
            refuse_delivery(self.settings, ctx.key, ctx.attempt, ctx.refused)


def attempt_hooks(settings: Settings) -> tuple[PhaseHook, ...]:
    """The hooks of every attempt, in the order they are entered (exited in reverse)."""
    return (PausePoints(), Tracing(settings.web_base_url), TaskEvents(settings))
