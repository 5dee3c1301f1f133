"""The durable-claim option: with `claim_replicas = N` a claim counts only once N replicas hold
it (Redis `WAIT`); short of that the tool does not run and the record says so honestly.

Real processes: a primary and a replica `redis-server`; a lagging replica is a replica process
stopped with SIGSTOP (it holds its connection but acknowledges nothing).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from devtools.processes import RedisServer, Worker, wait_for
from dex_celery import DID_NOT_RUN, CallStatus, Dex
from dex_celery.ledger.durability import wait_for_replicas
from tests.support.faults.crash import lines, wait_finished


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer(tmp_path / "primary", appendonly=True, appendfsync="always").start()
    replica = RedisServer(
        tmp_path / "replica", extra_args=("--replicaof", "127.0.0.1", str(primary.port))
    ).start()
    client = redis.Redis(port=primary.port, decode_responses=True)
    wait_for(
        lambda: (
            client.info("replication").get("connected_slaves") == 1
            and redis.Redis(port=replica.port).info("replication").get("master_link_status") == "up"
        ),
        timeout=30,
        what="the replica to follow the primary",
    )
    yield primary, replica
    _resume(replica)
    replica.kill()
    primary.kill()


def _pause(server: RedisServer) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)


def _resume(server: RedisServer) -> None:
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)


def test_wait_counts_the_replicas_that_hold_earlier_writes(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = pair
    client = redis.Redis(port=primary.port, decode_responses=True)
    client.set("claim", "1")
    assert wait_for_replicas(client, channel="probe", replicas=0, timeout=0.2) is None
    assert wait_for_replicas(client, channel="probe", replicas=1, timeout=2) is None
    assert redis.Redis(port=replica.port, decode_responses=True).get("claim") == "1"

    short = wait_for_replicas(client, channel="probe", replicas=2, timeout=0.3)
    assert short is not None and (short.wanted, short.acked) == (2, 1)
    assert short.detail.startswith(DID_NOT_RUN)

    _pause(replica)
    client.set("claim", "2")
    started = time.monotonic()
    short = wait_for_replicas(client, channel="probe", replicas=1, timeout=0.5)
    assert short is not None and short.acked == 0
    assert 0.4 <= time.monotonic() - started < 5
    _resume(replica)


@pytest.fixture
def env(env: dict[str, str], pair: tuple[RedisServer, RedisServer]) -> dict[str, str]:
    primary, _ = pair
    return {
        **env,
        "DEX_REDIS_URL": primary.url,
        "DEX_CLAIM_REPLICAS": "1",
        "DEX_CLAIM_REPLICAS_TIMEOUT": "0.5",
    }


def test_a_claim_no_replica_holds_never_runs_the_tool(
    dex: Dex,
    pair: tuple[RedisServer, RedisServer],
    start_worker: Callable[..., Worker],
    sweeper: object,
) -> None:
    """A write whose claim no replica acknowledged ends `failed`, "the tool did not run", and the
    tool's own log is empty; a read is retried and fails the same way when every attempt is
    refused. Once the replica catches up, calls run (once each) and succeed."""
    _primary, replica = pair
    assert dex.settings.claim_replicas == 1
    start_worker(concurrency=1)
    client = dex.client()
    _pause(replica)
    try:
        write = client.request_call("s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 0})
        read = client.request_call("s1", "t1", "r", "flaky_read", {"fail_times": 0})
        done_write = wait_finished(dex, write.key, timeout=30)
        done_read = wait_finished(dex, read.key, timeout=30)
    finally:
        _resume(replica)
    assert done_write.status is CallStatus.FAILED
    assert (done_write.error or "").startswith(DID_NOT_RUN), done_write.error
    assert "0 of the 1 Redis replica(s)" in (done_write.error or "")
    assert lines(write.key, "start") == []
    assert done_read.status is CallStatus.FAILED
    assert done_read.attempts == 3
    assert (done_read.error or "").startswith(DID_NOT_RUN), done_read.error
    assert lines(read.key, "start") == []

    again = client.request_call("s1", "t2", "w", "slow_non_idempotent_write", {"seconds": 0})
    done = wait_finished(dex, again.key, timeout=30)
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert [a for a, _, _ in lines(again.key, "start")] == [1]
