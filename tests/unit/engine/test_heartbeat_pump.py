"""The heartbeat thread's schedule: every running lease is renewed within a third of itself.

A stub ledger records when each key was renewed; the real worker path is covered by
`tests/integration/engine/test_short_heartbeat.py`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from devtools.processes import wait_for
from dex_celery.engine.attempt.worker import HeartbeatPump
from dex_celery.ledger.ledger import Ledger
from dex_celery.model.ids import CallKey
from dex_celery.tools.tool import ToolContext


class RecordingLedger:
    def __init__(self) -> None:
        self.beats: dict[str, list[float]] = {}
        self.fenced: set[str] = set()
        self.held: dict[str, int] = {}
        self.released: list[str] = []
        self.lock = threading.Lock()

    def heartbeat(self, running: Sequence[tuple[str, str]]) -> set[str]:
        with self.lock:
            for key, _fence in running:
                self.beats.setdefault(key, []).append(time.monotonic())
            return {key for key, _ in running if key in self.fenced}

    def hold_running(self, fenced: Sequence[tuple[str, float]]) -> None:
        with self.lock:
            for key, _timeout in fenced:
                self.held.setdefault(key, 0)
                self.held[key] += 1

    def release_running(self, key: str) -> None:
        with self.lock:
            self.released.append(key)

    def times(self, key: str) -> list[float]:
        with self.lock:
            return list(self.beats.get(key, []))


def _pump(global_timeout: float) -> tuple[HeartbeatPump, RecordingLedger]:
    ledger = RecordingLedger()
    return HeartbeatPump(cast(Ledger, cast(Any, ledger)), global_timeout / 3), ledger


def _ctx(key: str) -> ToolContext:
    return ToolContext(CallKey.parse(key), 1)


def test_an_idle_pump_is_woken_by_a_shorter_lease() -> None:
    """Idle after a long-lease attempt, the pump renews a new 0.6 s lease every 0.2 s, not a third
    of the deployment's 30 s."""
    pump, ledger = _pump(30.0)
    pump.add("s/t/long", "f0", _ctx("s/t/long"), 30.0)
    pump.remove("s/t/long")
    time.sleep(0.1)  # the thread is now asleep with nothing to renew
    added = time.monotonic()
    pump.add("s/t/short", "f1", _ctx("s/t/short"), 0.6)
    wait_for(lambda: len(ledger.times("s/t/short")) >= 3, timeout=5, what="three renewals")
    beats = [added, *ledger.times("s/t/short")]
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert max(gaps) < 0.6, gaps


def test_a_stream_of_new_attempts_does_not_postpone_the_next_beat() -> None:
    """Each `add` wakes the pump; the next beat stays due a third of the lease after the last."""
    pump, ledger = _pump(30.0)
    pump.add("s/t/a", "fa", _ctx("s/t/a"), 0.9)
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < 1.5:
        key = f"s/t/n{i}"
        pump.add(key, "f", _ctx(key), 30.0)
        i += 1
        time.sleep(0.05)
    beats = [started, *ledger.times("s/t/a")]
    assert len(beats) >= 5, beats
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert max(gaps) < 0.9, gaps


class FlakyLedger:
    """Raises `errors` (in turn) for the first `failures` heartbeats, then answers."""

    def __init__(self, failures: float, *errors: Exception) -> None:
        self.failures = failures
        self.errors = errors
        self.calls = 0

    def heartbeat(self, running: Sequence[tuple[str, str]]) -> set[str]:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.errors[self.calls % len(self.errors)]
        return set()

    def hold_running(self, fenced: Sequence[tuple[str, float]]) -> None:
        """The running lease of fenced attempts (S5.4): this ledger keeps none."""


def _flaky_pump(ledger: FlakyLedger) -> HeartbeatPump:
    return HeartbeatPump(cast(Ledger, cast(Any, ledger)), 30.0)


def test_a_tool_heartbeat_rides_out_redis_errors_within_the_lease() -> None:
    """Issue 19, finding 6 (unit view): connection, time-out, socket and reply errors are tried
    again; the tool gets True, not redis-py's exception."""
    import redis

    from dex_celery.errors import LedgerError

    ledger = FlakyLedger(
        4,
        redis.ConnectionError("Connection reset by peer"),
        redis.TimeoutError("Timeout reading from socket"),
        ConnectionRefusedError(111, "Connection refused"),
        LedgerError("ledger script heartbeat failed: READONLY You can't write against a replica"),
    )
    pump = _flaky_pump(ledger)
    ctx = ToolContext(CallKey.parse("s/t/c"), 1, beat=lambda: pump.beat("s/t/c"))
    pump.add("s/t/c", "f", ctx, 5.0)
    assert ctx.heartbeat() is True
    assert ledger.calls == 5
    assert not ctx.cancelled


def test_a_tool_heartbeat_says_false_once_the_lease_has_lapsed_unreached() -> None:
    """Redis away for longer than the lease: the tool is told to stop (False, cancelled), within
    about the lease, and still never sees a Redis error."""
    import redis

    ledger = FlakyLedger(float("inf"), redis.ConnectionError("Connection refused"))
    pump = _flaky_pump(ledger)
    ctx = ToolContext(CallKey.parse("s/t/c"), 1, beat=lambda: pump.beat("s/t/c"))
    started = time.monotonic()
    pump.add("s/t/c", "f", ctx, 0.6)
    assert ctx.heartbeat() is False
    took = time.monotonic() - started
    assert took <= 0.6, took
    assert ctx.cancelled
    assert ledger.calls >= 2


def test_a_fenced_attempt_keeps_its_running_lease_until_released() -> None:
    """S5.4: once the ledger says an attempt is fenced, the tool is cancelled and no longer
    heartbeats, but while it goes on its running lease is renewed every beat; `release` (after
    the late result is in SQL) drops it; an attempt never fenced costs no release."""
    pump, ledger = _pump(0.6)
    ctx = _ctx("s/t/fenced")
    with ledger.lock:
        ledger.fenced.add("s/t/fenced")
    pump.add("s/t/fenced", "f1", ctx, 0.6)
    wait_for(lambda: ctx.cancelled, timeout=5, what="the fenced attempt cancelled")
    wait_for(lambda: ledger.held.get("s/t/fenced", 0) >= 3, timeout=5, what="three renewals")
    pump.remove("s/t/fenced")  # the tool returned; the late result is being recorded
    renewed = ledger.held["s/t/fenced"]
    wait_for(lambda: ledger.held["s/t/fenced"] > renewed, timeout=5, what="renewed until released")
    pump.release("s/t/fenced")
    pump.release("s/t/plain")
    assert ledger.released == ["s/t/fenced"]
