"""Redis restarted empty (no persistence) while calls are in flight: SQL still knows them, and the
sweeper ends them conservatively (docs/ledger.md, "Rollback"; S3.2, S4.3).

A redis-server of this test's own (the session one is shared by the other tests) is SIGKILLed
and started again on the same port with no data, while four tools of the four effect classes are
running in a live prefork worker. The ledger that knew which attempts reached a worker is gone:
writes must end `outcome_unknown` and never run again; reads and idempotent writes are re-run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import pytest

from devtools.processes import RedisServer, Worker, wait_for
from devtools.toolapp import make_app
from dex_celery import DID_NOT_RUN, OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever
from tests.support.faults.crash import (
    BROKER_QUEUE,
    finished_events,
    lines,
    release_tools,
    tool_messages,
    wait_finished,
    wait_late_result,
    wait_started,
)

pytestmark = pytest.mark.crash

WRITES = ("slow_non_idempotent_write", "slow_unclassified")
RERUN = ("slow_read", "slow_idempotent_write")


def _ended_once(key: str) -> bool:
    return len(lines(key, "end")) == 1


def test_redis_restarted_empty_ends_writes_unknown_and_reruns_reads(
    own_dex: Dex,
    env: dict[str, str],
    own_redis: RedisServer,
    start_worker: Callable[..., Worker],
) -> None:
    """Writes (non-idempotent, unclassified) in flight when the ledger lost its data end
    `outcome_unknown` (S4.3, S4.5) and never run again (S3.2); a read and an idempotent write are
    run again with the same idempotency key (S2.1, S3.1) and succeed; no call stays pending; what
    the old attempts return afterwards is kept as evidence only (S5.2)."""
    dex = own_dex
    start_worker(concurrency=4, extra_env={"DEX_REDIS_URL": own_redis.url})
    client = dex.client()
    records = {
        tool: client.request_call("s1", "t1", f"c-{tool}", tool, {"seconds": 120})
        for tool in WRITES + RERUN
    }
    for record in records.values():
        wait_started(record.key)
    old_epoch = dex.epoch()

    own_redis.restart()
    # Nothing survived: no call hash, no broker message. (A worker reconnecting at once may
    # already have declared its queue binding again: Kombu's bookkeeping, not data.)
    survivors = [
        name
        for name in dex.ledger.client.scan_iter()
        if str(name).startswith(dex.ledger.keys.call("")[: -len("{}")])
        or str(name).startswith(BROKER_QUEUE)
    ]
    assert survivors == []

    # Writes: ended conservatively while their tools are still running.
    for tool in WRITES:
        done = wait_finished(dex, records[tool].key, timeout=30)
        assert done.status is CallStatus.OUTCOME_UNKNOWN, done
        assert "the ledger lost track of it" in (done.error or "")
        (message,) = tool_messages(dex, done.key)
        assert OUTCOME_UNKNOWN_TOOL_RESULT in message
    # Reads: reopened under the new ledger's life.
    wait_for(
        lambda: all(dex.ledger.read(records[t].key) is not None for t in RERUN),
        timeout=30,
        what="the sweeper to reopen the read and the idempotent write",
    )
    assert dex.epoch(refresh=True) != old_epoch

    # Celery 5.7 / Kombu 5.7 on this machine: the worker's main process does not survive the
    # broker vanishing (`Unrecoverable error: AttributeError(... 'hostname')` while Kombu closes
    # the channel); it shuts down warm, waiting for its running tools. A supervisor would start
    # it again; so does the test.
    release_tools(env)  # the old attempts return now (too late); the reopened ones at once
    start_worker(extra_env={"DEX_REDIS_URL": own_redis.url})
    for tool in RERUN:
        done = wait_finished(dex, records[tool].key, timeout=40)
        assert done.status is CallStatus.SUCCEEDED, done
        assert done.result == '"done"'
        starts = lines(done.key, "start")
        assert len(starts) == 2, starts  # the attempt cut off by the data loss, and the rerun
        assert {k for _, _, k in starts} == {done.key}
        assert len(tool_messages(dex, done.key)) == 1

    for tool in WRITES:
        key = records[tool].key
        wait_for(
            partial(_ended_once, key),
            timeout=30,
            what=f"the old attempt of {key} to return",
        )
        final = wait_late_result(dex, key)
        assert final.status is CallStatus.OUTCOME_UNKNOWN  # the late return changed nothing
        assert len(lines(key, "start")) == 1  # never run again (S3.2)
        assert len(tool_messages(dex, key)) == 1

    assert not [r for r in client.get_agent_snapshot("s1").tool_calls if not r.finished]
    for record in records.values():
        # The stream before the restart was lost with Redis; after it, one finished event each.
        assert finished_events(dex, record.key) == 1


def test_rerun_after_data_loss_that_never_reaches_a_worker_is_not_called_did_not_run(
    dex: Dex, env: dict[str, str], own_redis: RedisServer
) -> None:
    """S4.2, S4.3: a read and an idempotent write that had reached a worker when Redis lost its
    data are reopened, and if no rerun ever reaches a worker the call must not claim "the tool
    did not run": the lost ledger cannot vouch for that. The read ends `failed` (lost), the
    idempotent write `outcome_unknown`, as after any lost worker."""
    fast = {"DEX_REDIS_URL": own_redis.url, "DEX_SCHEDULE_TO_START": "0.5"}
    _app, lost = make_app(Settings.from_env({**env, **fast}))
    client = lost.client()
    records = {
        tool: client.request_call("s1", "t1", f"c-{tool}", tool, {"seconds": 0})
        for tool in WRITES + RERUN
    }
    for record in records.values():  # a worker (never started here) claimed every attempt
        claim = lost.ledger.claim(record.key, 1, owner="ghost:1", fence="f")
        assert claim.ok, claim
    # The non-idempotent write's claim also reached the database (the write fence), as a real
    # worker's does before any tool code; the unclassified write's worker died before that.
    noni = records["slow_non_idempotent_write"].key
    assert lost.store.claim_write(noni, 1, fence="f", owner="ghost:1", now=lost.ledger.now())

    own_redis.restart()
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(lost,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    try:
        done = {tool: wait_finished(lost, r.key, timeout=40) for tool, r in records.items()}
    finally:
        stop.set()
        thread.join(timeout=15)

    # Claimed in the database: it may have run. Never claimed there: no tool code ran, so the
    # reopened write that no worker takes ends "did not run", which the write fence proves.
    assert done["slow_non_idempotent_write"].status is CallStatus.OUTCOME_UNKNOWN
    unclassified = done["slow_unclassified"]
    assert unclassified.status is CallStatus.FAILED, unclassified
    assert (unclassified.error or "").startswith(DID_NOT_RUN), unclassified.error
    read, idempotent = done["slow_read"], done["slow_idempotent_write"]
    assert read.status is CallStatus.FAILED, read
    assert not (read.error or "").startswith(DID_NOT_RUN), read.error
    assert idempotent.status is CallStatus.OUTCOME_UNKNOWN, idempotent
    assert read.attempts == idempotent.attempts == 3
    for record in records.values():
        assert lines(record.key, "start") == []
        assert len(tool_messages(lost, record.key)) == 1
