"""A worker's warm shutdown (docs/reliability.md, "Deploys"): what the main process hands back
when its consumer stops, and what a second SIGTERM or the end of the grace does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from celery.worker import state

from dex_celery.processes.shutdown import WarmShutdown, hand_back_unstarted


@dataclass(eq=False)
class FakeRequest:
    """What `hand_back_unstarted` uses of Celery's `Request`."""

    id: str
    acknowledged: bool = False
    rejected: list[bool] = field(default_factory=list)

    def reject(self, requeue: bool = False) -> None:
        self.rejected.append(requeue)
        self.acknowledged = True


@pytest.fixture
def celery_state() -> Iterator[None]:
    reserved, active = set(state.reserved_requests), set(state.active_requests)
    yield
    state.reserved_requests.clear()
    state.reserved_requests.update(reserved)
    state.active_requests.clear()
    state.active_requests.update(active)


def test_only_messages_no_pool_process_started_are_handed_back(celery_state: None) -> None:
    running = FakeRequest("running")
    waiting = FakeRequest("waiting")
    answered = FakeRequest("answered", acknowledged=True)
    state.reserved_requests.update({running, waiting, answered})  # type: ignore[arg-type]
    state.active_requests.add(running)  # type: ignore[arg-type]

    assert hand_back_unstarted() == 1
    assert waiting.rejected == [True]  # requeued, for another worker
    assert running.rejected == [] and answered.rejected == []
    assert hand_back_unstarted() == 0  # never twice


def test_a_second_sigterm_ends_the_worker_and_the_grace_timer_does_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended: list[str] = []
    done = threading.Event()

    def end(self: WarmShutdown, why: str) -> None:
        ended.append(why)
        done.set()

    monkeypatch.setattr(WarmShutdown, "end", end)
    shutdown = WarmShutdown(lambda: 0.0, lambda: None)
    shutdown.begin()
    assert shutdown.gate.shut_already and ended == []  # no grace of its own: waits for tools
    shutdown.begin()
    assert done.wait(5) and ended == ["a second SIGTERM"]

    done.clear()
    timed = WarmShutdown(lambda: 0.05, lambda: None)
    timed.begin()
    assert done.wait(5) and ended[-1] == "the shutdown grace of 0.1 s is over"
