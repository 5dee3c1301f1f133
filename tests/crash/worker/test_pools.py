"""`async def` tools and IO-bound pools: prefork, threads and gevent (issue 11, tests 1 and 2).

Real `celery worker -P <pool>` processes. For each pool, one worker runs an async success, an
async tool error, an async tool past its start-to-close (on threads and gevent Celery has no soft
time limit: the worker's watchdog fences the attempt, then cancels the coroutine) and an async
tool awaiting longer than its heartbeat timeout without a heartbeat of its own (the lease is
renewed while it awaits). Then the worker is SIGKILLed with an async write and an async read in
flight: the write ends `outcome_unknown` and never runs again; the read is retried on a second
worker and succeeds. The tools' own side-effect logs witness every execution.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import VISIBILITY_TIMEOUT_ENV
from dex_celery import OUTCOME_UNKNOWN_TOOL_RESULT, CallRequest, CallStatus, Dex
from tests.support.faults import crash

pytestmark = pytest.mark.crash

POOLS = ["prefork", "threads", "gevent"]
TIMEOUT_PREFIX = "the tool ran past its start-to-close timeout"


@pytest.mark.parametrize("pool", POOLS)
def test_async_tools_on_every_pool(
    pool: str,
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    worker = start_worker(pool=pool, concurrency=4)
    client = dex.client()
    keys = {name: f"s1/t1/{name}" for name in ("ok", "error", "overtime", "long_await", "w", "r")}
    client.request_calls(
        [
            CallRequest("s1", "t1", "ok", "async_echo", {"text": pool, "delay": 0.2}),
            CallRequest("s1", "t1", "error", "async_failing", {"message": "order 7 is gone"}),
            CallRequest("s1", "t1", "overtime", "async_overtime", {"seconds": 20}),
            CallRequest("s1", "t1", "long_await", "async_long_await", {"seconds": 4}),
        ]
    )

    ok = crash.wait_finished(dex, keys["ok"], timeout=30)
    assert ok.status is CallStatus.SUCCEEDED, ok
    assert json.loads(ok.result or "") == {"text": pool, "attempt": 1}

    error = crash.wait_finished(dex, keys["error"], timeout=30)
    assert error.status is CallStatus.FAILED
    assert error.error == "order 7 is gone"
    assert error.attempts == 1

    overtime = crash.wait_finished(dex, keys["overtime"], timeout=30)
    assert overtime.status is CallStatus.FAILED
    assert (overtime.error or "").startswith(TIMEOUT_PREFIX), overtime.error
    # Fence, then cancel: the coroutine saw CancelledError and never reached its end.
    wait_for(
        lambda: crash.lines(keys["overtime"], "cancelled") != [], timeout=15, what="the cancel"
    )
    assert crash.lines(keys["overtime"], "end") == []
    assert crash.finished_events(dex, keys["overtime"]) == 1

    # 4 s in one await, heartbeat timeout 1.5 s: one attempt, never presumed lost.
    long_await = crash.wait_finished(dex, keys["long_await"], timeout=30)
    assert long_await.status is CallStatus.SUCCEEDED, long_await
    assert long_await.attempts == 1
    assert [a for a, _, _ in crash.lines(keys["long_await"], "start")] == [1]

    # SIGKILL with a write and a read in flight.
    client.request_calls(
        [
            CallRequest("s1", "t1", "w", "async_slow_non_idempotent_write", {"seconds": 60}),
            CallRequest("s1", "t1", "r", "async_slow_read", {"seconds": 60}),
        ]
    )
    crash.wait_started(keys["w"])
    crash.wait_started(keys["r"])
    worker.kill_all()
    crash.release_tools(env)  # a retry returns at once; the killed attempts can no longer return
    start_worker(pool=pool, extra_env={VISIBILITY_TIMEOUT_ENV: "2"})

    write = crash.wait_finished(dex, keys["w"], timeout=40)
    assert write.status is CallStatus.OUTCOME_UNKNOWN, write
    assert write.attempts == 1
    (message,) = crash.tool_messages(dex, keys["w"])
    assert OUTCOME_UNKNOWN_TOOL_RESULT in message

    read = crash.wait_finished(dex, keys["r"], timeout=40)
    assert read.status is CallStatus.SUCCEEDED, read
    assert read.attempts == 2
    assert [a for a, _, _ in crash.lines(keys["r"], "start")] == [1, 2]
    assert [a for a, _, _ in crash.lines(keys["r"], "end")] == [2]
    # The write never ran again, not even after the broker had time to redeliver.
    assert [a for a, _, _ in crash.lines(keys["w"], "start")] == [1]
    assert "never awaited" not in worker.log()


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_start_to_close_without_a_soft_time_limit_or_a_sweeper(
    pool: str, dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """Threads and gevent have no soft time limit, and no sweeper runs here: the worker's own
    watchdog fences the attempt at start-to-close and records the time-out, then cancels it. The
    sync `overtime` tool cannot be stopped; what it returns later is kept as evidence only."""
    start_worker(pool=pool, concurrency=4)
    client = dex.client()
    a = client.request_call("s1", "t1", "async", "async_overtime", {"seconds": 20})
    s = client.request_call("s1", "t1", "sync", "overtime", {"seconds": 3})
    for record in (a, s):
        done = crash.wait_finished(dex, record.key, timeout=15)
        assert done.status is CallStatus.FAILED
        assert "(worker watchdog)" in (done.error or ""), done.error
    wait_for(
        lambda: crash.lines(a.key, "cancelled") != [], timeout=10, what="the coroutine's cancel"
    )
    assert crash.lines(a.key, "end") == []
    late = crash.wait_late_result(dex, s.key, timeout=15)
    assert json.loads(json.loads(late.late_result or "{}")["payload"]) == "late value"
    assert late.status is CallStatus.FAILED


def test_threads_pool_with_50_calls_in_flight_killed(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """Test 2: `-P threads -c 50`, 50 calls running, the worker SIGKILLed. Per the tools' own
    log: every write that started is `outcome_unknown` and never ran again; every read and
    idempotent write started once more on a new worker and succeeded on attempt 2."""
    worker = start_worker(pool="threads", concurrency=50)
    tools = ["slow_read"] * 20 + ["slow_non_idempotent_write"] * 20 + ["slow_idempotent_write"] * 10
    requests = [
        CallRequest("s1", "t1", f"c{i}", tool, {"seconds": 60}) for i, tool in enumerate(tools)
    ]
    records = dex.client().request_calls(requests)
    for record in records:
        crash.wait_started(record.key, timeout=60)
    worker.kill_all()
    crash.release_tools(env)
    start_worker(pool="threads", concurrency=50, extra_env={VISIBILITY_TIMEOUT_ENV: "2"})
    for record, tool in zip(records, tools, strict=True):
        done = crash.wait_finished(dex, record.key, timeout=60)
        starts = [a for a, _, _ in crash.lines(record.key, "start")]
        if tool == "slow_non_idempotent_write":
            assert done.status is CallStatus.OUTCOME_UNKNOWN, done
            assert (done.attempts, starts) == (1, [1])
            assert crash.lines(record.key, "end") == []
        else:
            assert done.status is CallStatus.SUCCEEDED, done
            assert (done.attempts, starts) == (2, [1, 2])
            assert [a for a, _, _ in crash.lines(record.key, "end")] == [2]
        assert len(crash.tool_messages(dex, record.key)) == 1
        assert crash.finished_events(dex, record.key) == 1
