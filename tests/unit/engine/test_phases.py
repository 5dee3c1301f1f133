"""An attempt's phases and their hooks (dex_celery/engine/attempt/phases.py, hooks.py): hooks
are entered in list order and exited in reverse, each only on its own phases, with the context
current at the boundary; an exception leaving a phase reaches every hook; the pause points sit
on the boundaries the crash tests rely on (docs/testing.md), and the tracing hook opens the
spans of docs/operations.md nested as before."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dex_celery.engine import tracing
from dex_celery.engine.attempt.hooks import PausePoints, TaskEvents, Tracing, attempt_hooks
from dex_celery.engine.attempt.pause_points import (
    PAUSE_AT_ENV,
    PAUSE_DIR_ENV,
    PausePoint,
    armed,
    marker_name,
)
from dex_celery.engine.attempt.phases import AttemptContext, Phase, Phases
from dex_celery.ledger.ledger import Cause, Step, StepKind
from dex_celery.settings import Settings

KEY = "s/t/c"


class Recorder:
    """A hook that writes down every call it gets."""

    def __init__(self, name: str, phases: frozenset[Phase], log: list[tuple[object, ...]]) -> None:
        self.name = name
        self.enters = self.exits = phases
        self.log = log

    def watching(self) -> bool:
        return True

    def enter(self, phase: Phase, ctx: AttemptContext) -> object:
        self.log.append((self.name, "enter", phase, ctx))
        return (self.name, phase)

    def exit(
        self, phase: Phase, ctx: AttemptContext, token: object, error: BaseException | None
    ) -> None:
        assert token == (self.name, phase)
        self.log.append((self.name, "exit", phase, ctx, error))


def test_hooks_nest_like_with_blocks_and_see_the_context_of_the_boundary() -> None:
    log: list[tuple[object, ...]] = []
    outer = Recorder("outer", frozenset(Phase), log)
    runs = Recorder("runs", frozenset({Phase.RUN}), log)
    phases = Phases([outer, runs]).start(KEY, 1, "echo")
    with phases.phase(Phase.ATTEMPT):
        phases.parsed("s")
        with phases.phase(Phase.RUN):
            phases.ran(Cause.OK)
        phases.finished(Step(StepKind.FINISHED, status="succeeded"))
    calls = [(name, what, phase) for name, what, phase, *_ in log]
    assert calls == [
        ("outer", "enter", Phase.ATTEMPT),
        ("outer", "enter", Phase.RUN),
        ("runs", "enter", Phase.RUN),
        ("runs", "exit", Phase.RUN),
        ("outer", "exit", Phase.RUN),
        ("outer", "exit", Phase.ATTEMPT),
    ]
    assert log[0][3] == AttemptContext(KEY, 1, "echo")
    assert log[3][3] == AttemptContext(KEY, 1, "echo", "s", cause=Cause.OK)
    last = log[-1][3]
    assert isinstance(last, AttemptContext)
    assert (last.session, last.cause, last.step, last.outcome) == (
        "s",
        Cause.OK,
        StepKind.FINISHED,
        "succeeded",
    )
    with pytest.raises(AttributeError):  # immutable
        last.outcome = "failed"  # type: ignore[misc]


def test_an_error_leaving_a_phase_reaches_every_hook() -> None:
    log: list[tuple[object, ...]] = []
    phases = Phases([Recorder("a", frozenset(Phase), log), Recorder("b", frozenset(Phase), log)])
    attempt = phases.start(KEY, 1, "echo")
    boom = RuntimeError("the tool broke")
    with pytest.raises(RuntimeError), attempt.phase(Phase.RUN):
        raise boom
    assert [(e[0], e[1], e[-1]) for e in log if e[1] == "exit"] == [
        ("b", "exit", boom),
        ("a", "exit", boom),
    ]


def test_a_hook_that_fails_to_enter_exits_the_ones_entered() -> None:
    log: list[tuple[object, ...]] = []

    class Broken(Recorder):
        def enter(self, phase: Phase, ctx: AttemptContext) -> object:
            raise ValueError("no")

    phases = Phases([Recorder("a", frozenset(Phase), log), Broken("b", frozenset(Phase), log)])
    with pytest.raises(ValueError), phases.start(KEY, 1, "echo").phase(Phase.CLAIM):
        raise AssertionError("the block must not run")
    assert [(e[0], e[1]) for e in log] == [("a", "enter"), ("a", "exit")]
    assert isinstance(log[-1][-1], ValueError)


def test_the_one_list_is_pause_points_then_tracing_then_task_events() -> None:
    hooks = attempt_hooks(Settings())
    assert [type(h) for h in hooks] == [PausePoints, Tracing, TaskEvents]


@pytest.fixture
def armed_all(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "pause"
    points = [PausePoint.BEFORE_CLAIM, PausePoint.TOOL_STARTED, PausePoint.AFTER_TOOL]
    monkeypatch.setenv(PAUSE_AT_ENV, ",".join(points))
    monkeypatch.setenv(PAUSE_DIR_ENV, str(folder))
    armed.cache_clear()
    yield folder
    armed.cache_clear()


def _pauses_at(folder: Path, point: PausePoint, enter: Callable[[], object]) -> bool:
    """Run `enter` in a thread; True if it stopped at `point` (it is then released)."""
    done = threading.Event()

    def go() -> None:
        enter()
        done.set()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    marker = folder / marker_name(point, os.getpid(), KEY)
    paused = False
    while not done.is_set():
        if marker.exists():
            paused = True
            (folder / f"release-{point.value}").write_text("go")
            break
        done.wait(0.01)
    assert done.wait(10)
    return paused


def test_pause_points_sit_on_the_phase_boundaries(armed_all: Path) -> None:
    hook = PausePoints()
    ctx = AttemptContext(KEY, 1, "echo")
    assert _pauses_at(armed_all, PausePoint.BEFORE_CLAIM, lambda: hook.enter(Phase.ADMIT, ctx))
    assert _pauses_at(armed_all, PausePoint.TOOL_STARTED, lambda: hook.enter(Phase.RUN, ctx))
    # FINISH after a run pauses at after_tool; FINISH of a claim short of replicas (no run) not.
    ran = ctx._replace(cause=Cause.OK)
    assert _pauses_at(armed_all, PausePoint.AFTER_TOOL, lambda: hook.enter(Phase.FINISH, ran))
    marker = armed_all / marker_name(PausePoint.AFTER_TOOL, os.getpid(), KEY)
    marker.unlink()
    hook.enter(Phase.FINISH, ctx)
    assert not marker.exists()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.configure(provider)
    yield exported
    tracing.configure(None)
    provider.shutdown()


def test_tracing_opens_the_attempts_spans_nested_with_their_attributes(
    exporter: InMemorySpanExporter,
) -> None:
    phases = Phases([Tracing("https://dex.example")]).start(KEY, 2, "echo")
    with pytest.raises(RuntimeError), phases.phase(Phase.ATTEMPT):
        phases.parsed("sess")
        with phases.phase(Phase.ADMIT):
            with phases.phase(Phase.CLAIM):
                pass
            phases.claimed("read")
        with phases.phase(Phase.RUN):
            phases.ran(Cause.OK)
        with phases.phase(Phase.FINISH):
            phases.finished(Step(StepKind.RETRY, attempt=3))
        raise RuntimeError("retry")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert list(spans) == [tracing.CLAIM, tracing.RUN, tracing.FINISH, tracing.ATTEMPT]
    attempt = spans[tracing.ATTEMPT]
    for name in (tracing.CLAIM, tracing.RUN, tracing.FINISH):
        parent = spans[name].parent
        assert parent is not None and parent.span_id == attempt.context.span_id
        assert spans[name].attributes == {
            "dex.idempotency_key": KEY,
            "dex.attempt": 2,
            **({"dex.cause": "ok"} if name == tracing.RUN else {}),
            **({"dex.step": "retry"} if name == tracing.FINISH else {}),
        }
    shown = dict(attempt.attributes or {})
    assert str(shown.pop("dex.session_url")).startswith("https://dex.example")
    assert shown == {
        "dex.idempotency_key": KEY,
        "dex.attempt": 2,
        "dex.tool": "echo",
        "dex.session_id": "sess",
        "dex.effect_class": "read",
        "dex.outcome": "retry",
    }
    assert [e.name for e in attempt.events] == ["exception"]  # recorded on the way out
