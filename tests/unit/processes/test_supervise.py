"""`dex-celery dev`'s supervisor on a fake stack and a manual clock: what is restarted, when,
and what each exit and restart says (dex_celery/processes/supervise.py; the real processes are in
tests/integration/processes/test_dev_supervisor.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dex_celery.processes.supervise import Backoff, Supervisor


@dataclass
class FakeProcess:
    returncode: int | None = None


@dataclass
class FakeService:
    name: str
    pid: int
    process: FakeProcess = field(default_factory=FakeProcess)

    def alive(self) -> bool:
        return self.process.returncode is None


@dataclass
class FakeStack:
    services: list[Any]
    next_pid: int = 100
    respawned: list[str] = field(default_factory=list)

    def respawn(self, service: FakeService) -> FakeService:
        self.next_pid += 1
        fresh = FakeService(service.name, self.next_pid)
        self.services[self.services.index(service)] = fresh
        self.respawned.append(service.name)
        return fresh


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _supervised() -> tuple[FakeStack, Supervisor, Clock, list[str]]:
    stack = FakeStack([FakeService("redis-server", 1), FakeService("worker", 2)])
    clock, lines = Clock(), []
    supervisor = Supervisor(stack, Backoff(1.0, 8.0, 60.0), lines.append, clock)  # type: ignore[arg-type]
    supervisor.watch()
    return stack, supervisor, clock, lines


def worker(stack: FakeStack) -> FakeService:
    return next(s for s in stack.services if s.name == "worker")


def test_an_exited_worker_is_restarted_after_a_doubling_bounded_delay() -> None:
    stack, supervisor, clock, lines = _supervised()
    delays = []
    for exit_number in range(1, 6):
        clock.now += 5.0  # each life shorter than stable_after: exits in a row
        worker(stack).process.returncode = -9
        assert supervisor.poll() == []
        delays.append(float(lines[-1].split("restarting it in ")[1].split("s")[0]))
        assert f"(restart {exit_number})" in lines[-1]
        assert stack.respawned.count("worker") == exit_number - 1  # not before it is due
        clock.now += delays[-1]
        supervisor.poll()
        assert stack.respawned.count("worker") == exit_number
        assert lines[-1] == f"restarted worker: pid {worker(stack).pid} (restart {exit_number})"
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]


def test_a_worker_that_ran_long_enough_starts_over_at_the_first_delay() -> None:
    stack, supervisor, clock, lines = _supervised()
    for _ in range(3):
        clock.now += 1.0
        worker(stack).process.returncode = 1
        supervisor.poll()
        clock.now += 10.0
        supervisor.poll()
    clock.now += 120.0  # a healthy life
    worker(stack).process.returncode = 1
    supervisor.poll()
    assert "exited with code 1 after 120s; restarting it in 1s (restart 4)" in lines[-1]


def test_the_private_redis_is_not_restarted() -> None:
    stack, supervisor, _clock, _lines = _supervised()
    stack.services[0].process.returncode = 0
    assert [s.name for s in supervisor.poll()] == ["redis-server"]
    assert stack.respawned == []
