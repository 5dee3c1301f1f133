"""The sweeper's loop (`dex_celery/engine/upkeep/sweep.py`): a failed sweep never ends it, a stop ends
it at once. What each sweep moves is covered with real workers in tests/crash and
tests/integration/engine/test_sweep_orphans.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from dex_celery import Settings
from dex_celery.engine.upkeep.sweep import SweepReport, run_forever


@dataclass
class FlakySweeper:
    """Fails every other sweep; stops the loop after `until` sweeps."""

    stop: threading.Event
    until: int
    settings: Settings = field(default_factory=lambda: Settings(sweep_interval=0.01))
    sweeps: int = 0

    def sweep_once(self) -> SweepReport:
        self.sweeps += 1
        if self.sweeps >= self.until:
            self.stop.set()
        if self.sweeps % 2:
            raise RuntimeError("Redis went away for a moment")
        return SweepReport(lost=1)


@dataclass
class Holder:
    sweeper: FlakySweeper


def test_a_failed_sweep_does_not_end_the_loop_and_a_stop_does() -> None:
    stop = threading.Event()
    sweeper = FlakySweeper(stop, until=5)
    thread = threading.Thread(target=run_forever, args=(Holder(sweeper),), kwargs={"stop": stop})
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert sweeper.sweeps == 5


def test_a_report_counts_what_moved_not_its_errors() -> None:
    report = SweepReport(lost=1, expired=2, errors=7)
    assert report.moved == 3
    assert report.as_dict()["errors"] == 7
