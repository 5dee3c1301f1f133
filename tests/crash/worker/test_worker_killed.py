"""A worker SIGKILLed while a tool runs: the record is honest, and nothing runs twice that must
not (S3.2, S3.3, S4.3).

Two witnesses in every test: the SQL record (with its TOOL message and the finished event) and
the tool's own side-effect log, which counts real executions independently of the ledger.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
import redis

from devtools.processes import Worker, wait_for
from devtools.toolapp import BLOCK_BEFORE_CLAIM_ENV, VISIBILITY_TIMEOUT_ENV, prerun_marker
from dex_celery import DID_NOT_RUN, OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, Dex
from dex_celery.model.ids import CallKey
from tests.support.faults.crash import (
    KOMBU_UNACKED,
    broker_holds,
    finished_events,
    lines,
    refused,
    release_tools,
    republish,
    tool_messages,
    wait_finished,
    wait_started,
)
from tests.support.faults.rabbitmq import ON_BOTH_BROKERS

pytestmark = pytest.mark.crash

#: A Kombu visibility timeout short enough that a new worker restores the unacknowledged
#: messages of a killed one within seconds (the default is an hour).
SHORT_VISIBILITY = {VISIBILITY_TIMEOUT_ENV: "2"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it runs no code any more.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split(" ", 1)[0] != "Z"
    except FileNotFoundError:
        return False


@ON_BOTH_BROKERS
def test_non_idempotent_write_killed_mid_call_is_outcome_unknown_and_never_runs_again(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    """S4.3, S4.5: killed after the claim, a write ends `outcome_unknown`; S3.2, S3.3: a stale or
    duplicated delivery of its message is refused by the claim and never runs the tool."""
    worker = start_worker()
    client = dex.client()
    record = client.request_call("s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 60})
    wait_started(record.key)

    worker.kill_all()
    done = wait_finished(dex, record.key, timeout=30)

    assert done.status is CallStatus.OUTCOME_UNKNOWN
    assert done.attempts == 1
    assert "may or may not have taken effect" in (done.error or "")
    assert [a for a, _, _ in lines(record.key, "start")] == [1]
    assert lines(record.key, "end") == []
    (message,) = tool_messages(dex, record.key)
    assert OUTCOME_UNKNOWN_TOOL_RESULT in message
    assert finished_events(dex, record.key) == 1

    # The message is acknowledged late (every tool task is: docs/ledger.md, "Celery options"),
    # so the broker gives it back (RabbitMQ at once, when the dead worker's connection closed;
    # Redis after its visibility timeout, short here) and a new worker's claim refuses it.
    assert broker_holds(env, CallKey.parse(record.key).task_id(1))
    start_worker(extra_env=SHORT_VISIBILITY)
    wait_for(
        lambda: refused(dex, record.key) >= 1,
        timeout=30,
        what="the ledger to refuse the redelivered message's claim",
    )
    # Replays of the same message, as an operator's or a duplicate delivery: refused too.
    before = refused(dex, record.key)
    republish(dex, done, attempt=1)
    wait_for(
        lambda: refused(dex, record.key) > before,
        timeout=30,
        what="the ledger to refuse the replayed message's claim",
    )
    # The same message again, a second replay: still refused, still one execution.
    republish(dex, done, attempt=1)
    wait_for(
        lambda: refused(dex, record.key) > before + 1,
        timeout=30,
        what="the ledger to refuse the second replay",
    )
    assert [a for a, _, _ in lines(record.key, "start")] == [1]
    assert client.get_call(record.key) == done
    assert len(tool_messages(dex, record.key)) == 1
    assert finished_events(dex, record.key) == 1


def test_only_the_main_process_killed_gives_an_honest_record(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    """S4.1, S4.3: SIGKILL of the worker's main process only. Whatever billiard's pool child does
    then, the record must match the tool's own log: `succeeded` exactly when the tool logged its
    end, `outcome_unknown` otherwise.

    Observed here (Celery 5.7, billiard 4.3): Celery's prefork `process_initializer` sets
    `PR_SET_PDEATHSIG=SIGKILL` in every pool child, so the kernel kills the child with its parent
    and this is the lost-machine case again: `outcome_unknown`, one start, no end.
    """
    worker = start_worker()
    client = dex.client()
    record = client.request_call("s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 60})
    child = wait_started(record.key)
    assert child in worker.children()

    worker.kill_main()
    try:
        wait_for(lambda: not _alive(child), timeout=5, what="the pool child to die with its parent")
        child_survived = False
    except AssertionError:
        child_survived = True
    release_tools(env)  # a surviving child would now finish the tool and record its result
    done = wait_finished(dex, record.key, timeout=30)

    ended = lines(record.key, "end")
    assert [a for a, _, _ in lines(record.key, "start")] == [1]
    assert bool(ended) is (done.status is CallStatus.SUCCEEDED), (ended, done)
    if ended:
        assert done.result == '"done"'
    else:
        assert done.status is CallStatus.OUTCOME_UNKNOWN, done
    assert finished_events(dex, record.key) == 1
    # The observed behaviour, kept as an assertion so that a change in Celery is noticed.
    assert not child_survived
    assert done.status is CallStatus.OUTCOME_UNKNOWN


@ON_BOTH_BROKERS
@pytest.mark.parametrize("tool", ["slow_read", "slow_idempotent_write"])
def test_retryable_call_killed_mid_call_is_retried_with_the_same_key(
    tool: str,
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    """S3.1, S4.3: a read or idempotent write whose worker died is retried as attempt 2 on another
    worker and succeeds; S2.1: every attempt saw the same idempotency key. S3.3: the broker's own
    redelivery of the killed worker's unacknowledged (late-ack) message cannot claim."""
    first = start_worker()
    client = dex.client()
    record = client.request_call("s1", "t1", "c1", tool, {"seconds": 60})
    first_pid = wait_started(record.key)

    first.kill_all()
    # Late ack: the killed worker's message is still the broker's to give back (RabbitMQ put it
    # back in the queue when the dead worker's connection closed).
    task_id = CallKey.parse(record.key).task_id(1)
    wait_for(
        lambda: broker_holds(env, task_id),
        timeout=10,
        what="the broker to hold the killed attempt's unacknowledged message",
    )
    release_tools(env)  # attempt 2 returns at once; the killed attempt 1 can no longer return
    second = start_worker(extra_env=SHORT_VISIBILITY)
    done = wait_finished(dex, record.key, timeout=40)

    assert done.status is CallStatus.SUCCEEDED, done
    assert done.attempts == 2
    starts = lines(record.key, "start")
    assert [a for a, _, _ in starts] == [1, 2]
    assert {k for _, _, k in starts} == {record.key}
    assert starts[0][1] == first_pid and starts[1][1] != first_pid
    assert [a for a, _, _ in lines(record.key, "end")] == [2]

    # Kombu restores attempt 1's unacknowledged message after the visibility timeout (RabbitMQ
    # delivers it from the queue at once); the ledger refuses its claim (the call is finished, or attempt 1 is stale).
    redelivered = f"Task dex.tool.{tool}[{record.key}#1] received"
    wait_for(
        lambda: redelivered in second.log() and refused(dex, record.key) >= 1,
        timeout=40,
        what="the broker's redelivery of attempt 1 to reach the new worker and be refused",
    )
    assert [a for a, _, _ in lines(record.key, "start")] == [1, 2]
    assert client.get_call(record.key) == done
    assert len(tool_messages(dex, record.key)) == 1
    assert finished_events(dex, record.key) == 1


def test_broker_redelivery_of_a_held_write_after_it_expired_cannot_claim(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    """S3.2, S3.3, S4.2: a write message the killed worker held before its claim (delivered,
    not acknowledged) expires in the ledger and ends `failed` with the did-not-run prefix; when
    Kombu later restores that message to a new worker, its claim is refused and the tool never
    runs. (A worker no longer holds a message it has no free slot for: every tool task is
    acknowledged late, so the test hook holds it before the claim instead.)"""
    worker = start_worker(concurrency=1, extra_env={BLOCK_BEFORE_CLAIM_ENV: "1"})
    client = dex.client()
    queued = client.request_call("s1", "t1", "queued", "slow_non_idempotent_write", {"seconds": 0})
    task_id = CallKey.parse(queued.key).task_id(1)
    wait_for(prerun_marker(task_id).exists, timeout=30, what="the worker to hold the write")
    broker = redis.Redis.from_url(env["DEX_REDIS_URL"])
    assert [m for m in broker.hvals(KOMBU_UNACKED) if task_id.encode() in m]

    worker.kill_all()
    done = wait_finished(dex, queued.key, timeout=30)
    assert done.status is CallStatus.FAILED, done
    assert (done.error or "").startswith(DID_NOT_RUN), done.error

    fresh = start_worker(extra_env=SHORT_VISIBILITY)
    redelivered = f"Task dex.tool.slow_non_idempotent_write[{queued.key}#1] received"
    wait_for(
        lambda: redelivered in fresh.log() and refused(dex, queued.key) >= 1,
        timeout=40,
        what="the broker's redelivery of the expired write to be refused",
    )
    assert lines(queued.key, "start") == []
    assert client.get_call(queued.key) == done
    assert finished_events(dex, queued.key) == 1
