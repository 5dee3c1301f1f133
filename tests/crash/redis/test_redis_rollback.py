"""Redis comes back from an older snapshot (no append-only file) while calls are in flight
(docs/ledger.md, "Rollback" and "The write fence"; S3.2, S4.2, S4.3, S10.2).

A redis-server of the test's own, with RDB snapshots only (the stock configuration), holds the
ledger and the broker. A snapshot is taken at one stage of four calls (one per effect class),
the calls move on, then Redis is SIGKILLed and started again from that older snapshot: its
hashes and broker messages are older than what really happened. For every stage and class: no
write runs twice, no call whose tool ran is recorded "did not run", every call ends, and each
record agrees with the tool's own log.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from devtools.processes import RedisServer, Worker, wait_for
from devtools.toolapp import STALL_WRITER_ENV, VISIBILITY_TIMEOUT_ENV
from dex_celery import DID_NOT_RUN, CallStatus, Dex
from dex_celery.model.records import ToolCallRecord
from tests.support.faults.crash import (
    events,
    finished_events,
    lines,
    refused,
    release_tools,
    tool_messages,
    wait_finished,
    wait_started,
)

pytestmark = pytest.mark.crash

WRITES = ("slow_non_idempotent_write", "slow_unclassified")
RERUNNABLE = ("slow_read", "slow_idempotent_write")


def _snapshot(server: RedisServer) -> None:
    redis.Redis.from_url(server.url).save()
    assert (server.directory / "dump.rdb").exists()


def _roll_back(server: RedisServer) -> None:
    """SIGKILL Redis and start it again: it loads the older snapshot, not what came after."""
    server.restart()


def _check_invariants(dex: Dex, records: dict[str, ToolCallRecord]) -> dict[str, ToolCallRecord]:
    done = {tool: wait_finished(dex, r.key, timeout=60) for tool, r in records.items()}
    for tool, record in done.items():
        starts = lines(record.key, "start")
        if tool in WRITES:
            assert len(starts) <= 1, (tool, starts)  # S3.2: never twice
        if starts:  # the tool ran: never "did not run"
            assert not (record.error or "").startswith(DID_NOT_RUN), record
        if record.status is CallStatus.SUCCEEDED:
            assert lines(record.key, "end"), record  # a success the tool really returned
        assert len(tool_messages(dex, record.key)) == 1, record  # exactly one record
        # S7.3: one finished event each, also for calls whose event went back in time with
        # the stream (announced again after the rollback).
        wait_for(
            lambda key=record.key: len(events(dex, type_="tool_call_finished", key=key)) >= 1,
            timeout=15,
            what=f"the finished event of {record.key}",
        )
        assert finished_events(dex, record.key) == 1, record
    return done


def _request(dex: Dex) -> dict[str, ToolCallRecord]:
    client = dex.client()
    return {
        tool: client.request_call("s1", "t1", f"c-{tool}", tool, {"seconds": 120})
        for tool in (*WRITES, *RERUNNABLE)
    }


def test_snapshot_with_the_messages_still_queued(
    own_dex: Dex,
    env: dict[str, str],
    own_redis: RedisServer,
    start_worker: Callable[..., Worker],
) -> None:
    """The snapshot holds every call enqueued; by the rollback every tool is running. The
    rolled-back broker hands the messages out again and the hashes say "enqueued"."""
    records = _request(own_dex)
    _snapshot(own_redis)
    worker_env = {"DEX_REDIS_URL": own_redis.url}
    first = start_worker(concurrency=4, extra_env=worker_env)
    for record in records.values():
        wait_started(record.key)
    _roll_back(own_redis)
    first.stop()  # Kombu's consumer does not survive the broker vanishing; a supervisor restarts
    start_worker(concurrency=4, extra_env=worker_env)
    release_tools(env)
    done = _check_invariants(own_dex, records)
    for tool in WRITES:  # claimed in the database before the rollback: may have run
        assert done[tool].status is CallStatus.OUTCOME_UNKNOWN, done[tool]
        assert len(lines(done[tool].key, "start")) == 1
    for tool in RERUNNABLE:  # run again with the same key, and succeeded
        assert done[tool].status is CallStatus.SUCCEEDED, done[tool]


def test_snapshot_with_the_attempts_running(
    own_dex: Dex,
    env: dict[str, str],
    own_redis: RedisServer,
    start_worker: Callable[..., Worker],
) -> None:
    """The snapshot holds every attempt running; afterwards every call succeeded and was
    recorded. The rolled-back Redis says "running" and gives back the late-acked messages: the
    records stand and nothing runs again."""
    worker_env = {"DEX_REDIS_URL": own_redis.url, VISIBILITY_TIMEOUT_ENV: "2"}
    first = start_worker(concurrency=4, extra_env=worker_env)
    records = _request(own_dex)
    for record in records.values():
        wait_started(record.key)
    _snapshot(own_redis)
    release_tools(env)
    for record in records.values():
        assert wait_finished(own_dex, record.key).status is CallStatus.SUCCEEDED
    _roll_back(own_redis)
    first.stop()
    start_worker(concurrency=4, extra_env=worker_env)
    # The read's late-acked message comes back from the snapshot and is turned away.
    read_key = records["slow_read"].key
    wait_for(lambda: refused(own_dex, read_key) >= 1, timeout=30, what="the stale redelivery")
    done = _check_invariants(own_dex, records)
    for tool, record in done.items():
        assert record.status is CallStatus.SUCCEEDED, record
        assert len(lines(record.key, "start")) == 1, tool


def test_snapshot_with_the_outcomes_decided_but_not_recorded(
    own_dex: Dex,
    env: dict[str, str],
    own_redis: RedisServer,
    start_worker: Callable[..., Worker],
) -> None:
    """The snapshot holds outcomes the ledger decided that the worker never wrote to SQL (its
    writer stalled, then the worker died): they happened, and they are recorded once."""
    worker = start_worker(
        concurrency=4, extra_env={"DEX_REDIS_URL": own_redis.url, STALL_WRITER_ENV: "1"}
    )
    records = _request(own_dex)
    for record in records.values():
        wait_started(record.key)
    release_tools(env)
    for record in records.values():
        wait_for(
            lambda key=record.key: getattr(own_dex.ledger.read(key), "status", "") == "succeeded",
            timeout=30,
            what=f"the ledger to decide {record.key}",
        )
    worker.kill_all()
    _snapshot(own_redis)
    _roll_back(own_redis)
    done = _check_invariants(own_dex, records)
    for tool, record in done.items():
        assert record.status is CallStatus.SUCCEEDED, record
        assert len(lines(record.key, "start")) == 1, tool
