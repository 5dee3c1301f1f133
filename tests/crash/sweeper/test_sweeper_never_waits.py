"""Detection never waits for a tool slot: beat runs the sweeper in a thread of its own (S3.4,
S4.3).

With every slot of the surviving worker busy with long tools, a sweep sent as a Celery task
would wait in the queue behind them (it did: 40.9 s for a bound of 12 s). Here the only sweeper
is a real `celery beat` process, and the record of a worker SIGKILLed mid-write must arrive
within `2 x heartbeat timeout + sweep interval` plus `SLACK`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from devtools.processes import CeleryBeat, Worker
from dex_celery import CallStatus, Dex
from tests.support.faults.crash import (
    BROKER_QUEUE,
    lines,
    release_tools,
    wait_finished,
    wait_started,
)

pytestmark = pytest.mark.crash

HEARTBEAT = 2.0
SWEEP_INTERVAL = 0.5
#: Beyond the bound: one sweep's own run and its SQL write (tens of ms when idle, measured up to
#: ~0.5 s on this shared 2-core machine under load), plus the test's 50 ms polling and the
#: scheduling of four processes on two cores. The bound itself already holds a full lease of
#: slack (a lease lapses at most one heartbeat timeout after the kill, not two).
SLACK = 1.5
BOUND = 2 * HEARTBEAT + SWEEP_INTERVAL + SLACK


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    return {
        **env,
        "DEX_HEARTBEAT_TIMEOUT": str(HEARTBEAT),
        "DEX_SWEEP_INTERVAL": str(SWEEP_INTERVAL),
    }


@pytest.fixture
def beat(env: dict[str, str], tmp_path: Path) -> Iterator[CeleryBeat]:
    process = CeleryBeat("devtools.toolapp", env, tmp_path / "beat").start()
    yield process
    process.stop()


def test_a_killed_write_is_recorded_in_time_while_every_slot_is_busy(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], beat: CeleryBeat
) -> None:
    busy_worker = start_worker(concurrency=2)
    client = dex.client()
    long_reads = [
        client.request_call("s1", "t1", f"long{i}", "slow_read", {"seconds": 120}) for i in range(2)
    ]
    busy_pids = {wait_started(r.key) for r in long_reads}
    assert busy_pids <= set(busy_worker.children())

    doomed = start_worker(concurrency=1)
    write = client.request_call("s1", "t2", "w", "slow_non_idempotent_write", {"seconds": 120})
    assert wait_started(write.key) in doomed.children()

    doomed.kill_all()
    killed_at = time.monotonic()
    done = wait_finished(dex, write.key, timeout=BOUND + 30)
    took = time.monotonic() - killed_at
    print(f"record of the killed write after {took:.2f}s (bound {BOUND}s)")

    assert done.status is CallStatus.OUTCOME_UNKNOWN, done.error
    assert [a for a, _, _ in lines(write.key, "start")] == [1]
    assert lines(write.key, "end") == []
    assert took <= BOUND, f"the record took {took:.2f}s, bound {BOUND}s"
    # The long reads were never disturbed: still running on their first attempt.
    for record in long_reads:
        assert client.get_call(record.key).status is CallStatus.PENDING
        assert [a for a, _, _ in lines(record.key, "start")] == [1]
    # Beat sent no sweep task: nothing named dex.sweep waits behind the busy slots (or in Flower).
    broker = redis.Redis.from_url(env["DEX_REDIS_URL"])
    queued = [json.loads(m)["headers"]["task"] for m in broker.lrange(BROKER_QUEUE, 0, -1)]
    assert "dex.sweep" not in queued, queued
    assert "the dex sweeper runs every" in beat.log()
    release_tools(env)


def test_beat_stops_its_sweeper_cleanly(env: dict[str, str], dex: Dex, tmp_path: Path) -> None:
    """SIGTERM: beat's own shutdown stops the sweeper thread; the process exits without a
    traceback."""
    process = CeleryBeat("devtools.toolapp", env, tmp_path / "beat2").start()
    code = process.stop()
    log = process.log()
    assert code == 0, log[-3000:]
    assert "the dex sweeper stopped" in log
    assert "Traceback" not in log


def test_beat_leaves_sweeping_to_a_separate_process_when_told(
    env: dict[str, str], dex: Dex, tmp_path: Path
) -> None:
    """`DEX_SWEEP_IN_BEAT=0` (a deployment running `dex-celery sweep --loop` instead): beat
    schedules the reconcile job and starts no sweeper."""
    process = CeleryBeat(
        "devtools.toolapp",
        {**env, "DEX_SWEEP_IN_BEAT": "0"},
        tmp_path / "beat3",
        # Logged by beat's start hook just before it would start the sweeper (the test Redis
        # keeps no append-only file).
        ready_line="can lose acknowledged claims",
    ).start()
    assert process.stop() == 0
    log = process.log()
    assert "beat: Redis at" in log
    assert "the dex sweeper" not in log
