"""The start-to-close watchdog of a worker process (`invoke.Watchdog`): actions fire at their
deadline unless removed, and a steady stream of attempts does not wake its thread per call."""

from __future__ import annotations

import threading
import time
from typing import Any

from dex_celery.engine.attempt.invoke import Watchdog


def test_an_action_fires_at_its_deadline_unless_removed() -> None:
    dog = Watchdog()
    fired: list[str] = []
    done = threading.Event()
    removed = dog.add(0.05, lambda: fired.append("removed"))
    dog.add(0.1, lambda: (fired.append("due"), done.set()))
    dog.remove(removed)
    t0 = time.monotonic()
    assert done.wait(5)
    assert time.monotonic() - t0 >= 0.09
    assert fired == ["due"]


def test_attempts_that_end_before_their_deadline_do_not_wake_the_thread_each_time() -> None:
    dog = Watchdog()
    wakes = 0
    notify = dog._cond.notify

    def counted(*args: Any) -> None:
        nonlocal wakes
        wakes += 1
        notify(*args)

    dog._cond.notify = counted  # type: ignore[method-assign]
    for _ in range(300):
        # A quick tool: it ends before the woken thread gets to run, which then runs between
        # this attempt and the next.
        dog.remove(dog.add(300.0, lambda: None))
        time.sleep(0.001)
    assert wakes <= 2
