"""A pool child SIGKILLed while its parent lives: the WorkerLostError fast path (docs/ledger.md, crash
table) ends the attempt at once, without waiting for its lease (S4.3) or its queue deadline
(S4.2).

Heartbeat timeout and schedule-to-start are 60 s for these calls (in the policy snapshot, set by
the Dex that requests them, and in the worker's settings), and each test gives the record far
less time than that to appear: only the parent's `task_failure` signal can explain a quick
terminal record.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import BLOCK_BEFORE_CLAIM_ENV, make_app, prerun_marker
from dex_celery import DID_NOT_RUN, CallStatus, Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever
from dex_celery.model.ids import CallKey
from tests.support.faults.crash import (
    events,
    finished_events,
    lines,
    release_tools,
    wait_finished,
    wait_started,
)
from tests.support.faults.rabbitmq import ON_BOTH_BROKERS

pytestmark = pytest.mark.crash

SLOW = {"DEX_HEARTBEAT_TIMEOUT": "60", "DEX_SCHEDULE_TO_START": "60"}
#: Well under the 60 s lease and queue deadline; generous for a loaded 2-core machine.
FAST_PATH_BUDGET = 25.0


@pytest.fixture
def slow_dex(dex: Dex, env: dict[str, str]) -> Iterator[Dex]:
    """A Dex whose calls get 60 s leases and queue deadlines, with its own sweeper running.

    Built beside the `dex` fixture, which puts the test's environment (tool log folder included)
    into this process and creates the schema.
    """
    _app, dex = make_app(Settings.from_env({**env, **SLOW}))
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(dex,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    yield dex
    stop.set()
    thread.join(timeout=10)


@ON_BOTH_BROKERS
def test_pool_child_killed_mid_call_is_marked_lost_at_once(
    slow_dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """S4.3 through the fast path: the write ends `outcome_unknown` and the read is retried as
    attempt 2 (on the child the parent forks in its place) and succeeds, long before any lease
    could lapse."""
    dex = slow_dex
    worker = start_worker(extra_env=SLOW)
    client = dex.client()
    write = client.request_call("s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 120})
    read = client.request_call("s1", "t1", "r", "slow_read", {"seconds": 120})
    pids = {wait_started(write.key), wait_started(read.key)}
    assert pids <= set(worker.children())

    killed_at = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # Released only once both are dead (released before, a loaded machine may let the read's
    # attempt 1 see it and return before its kill): attempt 2 of the read then returns at once.
    release_tools(env)

    written = wait_finished(dex, write.key, timeout=FAST_PATH_BUDGET)
    assert written.status is CallStatus.OUTCOME_UNKNOWN, written
    assert "the pool process died" in (written.error or "")
    assert (written.finished_at or 0) - killed_at < FAST_PATH_BUDGET
    assert [a for a, _, _ in lines(write.key, "start")] == [1]
    assert lines(write.key, "end") == []

    done = wait_finished(dex, read.key, timeout=FAST_PATH_BUDGET)
    assert done.status is CallStatus.SUCCEEDED, done
    assert done.attempts == 2
    assert [a for a, _, _ in lines(read.key, "start")] == [1, 2]
    assert {k for _, _, k in lines(read.key, "start")} == {read.key}
    assert [a for a, _, _ in lines(read.key, "end")] == [2]
    assert worker.process is not None and worker.process.poll() is None  # the parent lived
    for key in (write.key, read.key):
        # The finished event follows the SQL commit (the writer's next step): wait for it.
        wait_for(
            lambda key=key: events(dex, type_="tool_call_finished", key=key),
            timeout=10,
            what=f"the finished event of {key}",
        )
        assert finished_events(dex, key) == 1


def test_pool_child_killed_before_its_claim_did_not_run(
    slow_dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """S4.2 through the fast path: a child that dies holding a delivered but unclaimed write makes
    the call `failed` with the did-not-run prefix at once, not at its 60 s queue deadline."""
    dex = slow_dex
    worker = start_worker(extra_env={**SLOW, BLOCK_BEFORE_CLAIM_ENV: "1"})
    record = dex.client().request_call("s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 0})
    marker = prerun_marker(CallKey.parse(record.key).task_id(1))
    wait_for(marker.exists, timeout=30, what="the message to reach a pool process")
    child = int(marker.read_text())
    assert child in worker.children()

    killed_at = time.time()
    os.kill(child, signal.SIGKILL)
    done = wait_finished(dex, record.key, timeout=FAST_PATH_BUDGET)

    assert done.status is CallStatus.FAILED, done
    assert (done.error or "").startswith(DID_NOT_RUN), done.error
    assert (done.finished_at or 0) - killed_at < FAST_PATH_BUDGET
    assert lines(record.key, "start") == []
    assert finished_events(dex, record.key) == 1
