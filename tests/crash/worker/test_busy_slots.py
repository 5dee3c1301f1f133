"""No call waits behind a busy slot, and a warm shutdown of a busy worker fails no call
(docs/reliability.md, "Deploys"; docs/ledger.md, "Celery options").

A worker whose two slots run long writes holds no further call: every tool task is acknowledged
late, so its running attempts fill its prefetch. Short calls requested meanwhile end on the idle
worker beside it within seconds; SIGTERM to the busy worker's main process then lets its writes
finish, hands back what it never started (a write held before its claim runs elsewhere, once),
and fails nothing. Prefork and threads pools, Redis and RabbitMQ brokers.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import BLOCK_BEFORE_CLAIM_ENV, LOG_ENV, prerun_marker
from dex_celery import CallStatus, Dex
from dex_celery.model.ids import CallKey
from dex_celery.model.records import ToolCallRecord
from tests.support.faults.crash import (
    finished_events,
    lines,
    release_tools,
    runs_in,
    tool_messages,
    wait_finished,
    wait_started,
)
from tests.support.faults.rabbitmq import RABBITMQ, REDIS

POOLS_AND_BROKERS = pytest.mark.parametrize(
    ("pool", "broker_kind"),
    [("prefork", REDIS), ("threads", REDIS), ("prefork", RABBITMQ), ("threads", RABBITMQ)],
    indirect=["broker_kind"],
)
#: What "within a few seconds" means here: a short call ends this soon after its request, on
#: a loaded 2-core CI machine (a short call takes milliseconds on an idle worker).
FEW_SECONDS = 8.0
#: The short calls: one per effect class that matters (a read, both kinds of write).
SHORT_TOOLS = ("slow_read", "slow_idempotent_write", "slow_non_idempotent_write")


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """No call here may expire in the queue: the second worker starts after a request, and a
    loaded machine can take longer than the tests' default 5 s to start it (every call here
    is checked to succeed within `FEW_SECONDS` of being asked instead)."""
    return {**env, "DEX_SCHEDULE_TO_START": "120"}


def request_shorts(dex: Dex, turn: str) -> list[ToolCallRecord]:
    client = dex.client()
    return [
        client.request_call("s1", turn, f"short-{i}", tool, {"seconds": 0})
        for i, tool in enumerate(SHORT_TOOLS)
    ]


def assert_served_by(dex: Dex, shorts: list[ToolCallRecord], idle: Worker, since: float) -> None:
    """Each short call succeeded within `FEW_SECONDS` of `since`, run once, by `idle`."""
    for record in shorts:
        left = since + FEW_SECONDS - time.monotonic()
        done = wait_finished(dex, record.key, timeout=max(left, 0.1))
        assert done.status is CallStatus.SUCCEEDED, done
        ((attempt, pid, _),) = lines(record.key, "start")
        assert attempt == 1
        assert runs_in(idle, pid), (record.key, pid, idle.pid, idle.children())


@POOLS_AND_BROKERS
@pytest.mark.usefixtures("sweeper")
def test_short_calls_never_wait_behind_long_writes_nor_for_a_warm_shutdown(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    pool: str,
) -> None:
    busy = start_worker(concurrency=2, pool=pool)
    client = dex.client()
    longs = [
        client.request_call("s1", "t1", f"long-{i}", "slow_non_idempotent_write", {"seconds": 60})
        for i in range(2)
    ]
    for record in longs:
        assert runs_in(busy, wait_started(record.key))
    idle = start_worker(concurrency=2, pool=pool)

    asked = time.monotonic()
    shorts = request_shorts(dex, "t2")
    assert_served_by(dex, shorts, idle, asked)
    assert all(lines(r.key, "end") == [] for r in longs)  # the long writes still run

    # A deploy: SIGTERM to the busy worker's main process, as systemd, docker and Kubernetes
    # send it. More short calls meanwhile; none waits for the busy worker's writes.
    os.kill(busy.pid, signal.SIGTERM)
    asked = time.monotonic()
    shorts += request_shorts(dex, "t3")
    assert_served_by(dex, shorts[3:], idle, asked)
    assert busy.process is not None and busy.process.poll() is None  # still finishing its writes

    release_tools(env)  # the long writes end; the busy worker then exits on its own
    for record in longs:
        done = wait_finished(dex, record.key, timeout=30)
        assert done.status is CallStatus.SUCCEEDED, done
        assert [a for a, _, _ in lines(record.key, "start")] == [1]
    assert busy.process.wait(timeout=30) == 0
    for record in longs + shorts:
        assert client.get_call(record.key).status is CallStatus.SUCCEEDED
        assert finished_events(dex, record.key) == 1
        assert len(tool_messages(dex, record.key)) == 1


@pytest.mark.parametrize(
    ("pool", "broker_kind"),
    [("prefork", REDIS), ("threads", REDIS), ("prefork", RABBITMQ)],
    indirect=["broker_kind"],
)
@pytest.mark.usefixtures("sweeper")
def test_a_write_not_yet_claimed_at_a_warm_shutdown_runs_elsewhere_once(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    pool: str,
) -> None:
    """S3.2, S3.3: a write delivered to the stopping worker but not yet claimed (held before its
    claim by the test hook) is handed back when it reaches the claim gate, and the other worker
    runs it: `succeeded`, one execution, nothing of the restart in its record or text."""
    stopping = start_worker(concurrency=1, pool=pool, extra_env={BLOCK_BEFORE_CLAIM_ENV: "1"})
    record = dex.client().request_call(
        "s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 0, "value": "paid"}
    )
    marker = prerun_marker(CallKey.parse(record.key).task_id(1))
    wait_for(marker.exists, timeout=30, what="the stopping worker to hold the write")
    other = start_worker(concurrency=1, pool=pool)

    os.kill(stopping.pid, signal.SIGTERM)
    wait_for(
        lambda: "worker: Warm shutdown" in stopping.log(),
        timeout=10,
        what="the warm shutdown to begin",
    )
    (Path(env[LOG_ENV]) / "release-prerun").write_text("go")

    done = wait_finished(dex, record.key, timeout=FEW_SECONDS + 5)
    assert done.status is CallStatus.SUCCEEDED, done
    assert done.result == '"paid"' and done.attempts == 1 and done.error is None
    ((attempt, pid, _),) = lines(record.key, "start")
    assert attempt == 1 and runs_in(other, pid)
    assert "handed back to the broker unclaimed" in stopping.log()
    assert stopping.process is not None and stopping.process.wait(timeout=30) == 0
    (message,) = tool_messages(dex, record.key)
    assert "paid" in message and "shut" not in message and "restart" not in message
