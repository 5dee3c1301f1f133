"""The ledger on a real Redis Cluster (docs/redis.md, "Redis Cluster"): three primaries with a
replica each, the ledger split into three shards, the broker a separate single redis-server.

Real Celery prefork workers, a real SIGKILL, and two witnesses in every test: the SQL record and
the tool's own side-effect log. A worker killed during a write leaves `outcome_unknown` and the
tool ran once (S4.3); a read killed mid-call is retried (S3.1). A failover of one primary (SIGKILL,
its replica promoted with `CLUSTER FAILOVER TAKEOVER`) keeps every write at most once, and only
the shards that primary held start a new life (S10.2); the other shards' calls go on unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import Worker, wait_for
from devtools.redis_cluster import RedisClusterNodes
from dex_celery import DID_NOT_RUN, CallStatus, Dex
from dex_celery.ledger.keys import ShardKeys
from tests.support.faults.crash import events, lines, release_tools, wait_finished, wait_started

pytestmark = pytest.mark.crash

SHARDS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """This module's own cluster: its last test kills one of its primaries."""
    nodes = RedisClusterNodes(tmp_path_factory.mktemp("crash-cluster"))
    try:
        yield nodes.start()
    finally:
        nodes.kill()


@pytest.fixture
def env(env: dict[str, str], cluster: RedisClusterNodes) -> dict[str, str]:
    """The ledger on the cluster; the session's redis-server is the broker only."""
    return {
        **env,
        "DEX_REDIS_URL": cluster.url,
        "DEX_BROKER_URL": env["DEX_REDIS_URL"],
        "DEX_LEDGER_SHARDS": str(SHARDS),
        # Calls queued behind slow ones, or across a failover, wait for a worker, not expire.
        "DEX_SCHEDULE_TO_START": "60",
    }


def _epochs(dex: Dex) -> list[str | None]:
    return [dex.ledger.client.get(s.epoch) for s in dex.keys.all_shards]


def test_the_ledger_spreads_over_every_primary(dex: Dex, cluster: RedisClusterNodes) -> None:
    """Each shard's keys share one slot; with three shards on three primaries, one each."""
    primaries = {cluster.primary_of(s.epoch).port for s in dex.keys.all_shards}
    assert len(primaries) == SHARDS
    for shard in dex.keys.all_shards:
        names = (shard.call("s/t/c"), shard.queue_index, shard.events, shard.epoch, shard.clock)
        assert len({cluster.client().keyslot(n) for n in names}) == 1, names


def test_worker_killed_during_a_write_is_outcome_unknown_and_a_read_is_retried(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    """S4.3: a write killed after its claim ends `outcome_unknown` and its tool ran once by its
    own log; S3.1: a read killed mid-call runs again and succeeds."""
    worker = start_worker()
    client = dex.client()
    write = client.request_call("s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 60})
    read = client.request_call("s1", "t1", "r", "slow_read", {"seconds": 60})
    wait_started(write.key)
    wait_started(read.key)

    worker.kill_all()
    release_tools(env)  # the retry returns at once; the killed attempt can no longer return
    start_worker()
    done = wait_finished(dex, write.key, timeout=60)
    assert done.status is CallStatus.OUTCOME_UNKNOWN
    assert [a for a, _, _ in lines(write.key, "start")] == [1]
    # Its finished event is appended in its shard's stream right after the SQL record.
    wait_for(
        lambda: len(events(dex, type_="tool_call_finished", key=write.key)) == 1,
        timeout=10,
        what="one finished event of the write",
    )

    again = wait_finished(dex, read.key, timeout=90)
    assert again.status is CallStatus.SUCCEEDED, (again.status, again.error)
    # Attempt 2 may expire in the queue while the new worker starts on a loaded machine; some
    # later attempt runs to its end.
    starts = [a for a, _, _ in lines(read.key, "start")]
    assert again.attempts >= 2 and starts[0] == 1 and len(starts) == len(set(starts)) >= 2
    assert [a for a, _, _ in lines(read.key, "end")] == [again.attempts]
    assert [a for a, _, _ in lines(write.key, "start")] == [1]


def test_failover_of_one_primary_renews_only_its_shards_and_runs_no_write_twice(
    dex: Dex,
    env: dict[str, str],
    cluster: RedisClusterNodes,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    tmp_path: Path,
) -> None:
    """S10.2 per shard: the primary's replica, promoted, is another server (its own run id), so
    the shards it serves start a new life and their calls in flight are judged from SQL; the
    shards of the other primaries keep their epoch. Every write ran at most once."""
    first_worker = start_worker(concurrency=4)
    client = dex.client()
    before = _epochs(dex)
    assert all(before)
    # Writes in flight on every shard while the primary dies, and quick ones after it.
    keys_by_shard: dict[int, list[str]] = {}
    for i in range(12):
        record = client.request_call(
            "s1", "t1", f"w{i}", "slow_non_idempotent_write", {"seconds": 3}
        )
        keys_by_shard.setdefault(dex.keys.shard_of(record.key), []).append(record.key)
    assert sorted(keys_by_shard) == list(range(SHARDS))
    first = next(iter(keys_by_shard[0]))
    wait_started(first)

    victim: ShardKeys = dex.keys.shard(0)
    primary = cluster.primary_of(victim.epoch)
    held = {s.index for s in dex.keys.all_shards if cluster.primary_of(s.epoch) is primary}
    cluster.fail_over(primary)

    every = [k for keys in keys_by_shard.values() for k in keys]
    for key in every:
        wait_finished(dex, key, timeout=120)
    # Writes requested after the failover run, on every shard, by a worker started after it:
    # its client finds the cluster though the first node its URL names may be the dead one.
    first_worker.kill_all()
    start_worker()
    late = [
        client.request_call("s1", "t2", f"after{i}", "slow_non_idempotent_write", {"seconds": 0})
        for i in range(6)
    ]
    assert {dex.keys.shard_of(r.key) for r in late} == set(range(SHARDS))
    for record in late:
        done = wait_finished(dex, record.key, timeout=120)
        assert done.status is CallStatus.SUCCEEDED, (done.status, done.error)
        assert len(lines(record.key, "start")) == 1

    wait_for(
        lambda: all(
            (e != b) == (i in held)
            for i, (e, b) in enumerate(zip(_epochs(dex), before, strict=True))
        ),
        timeout=30,
        what=f"a new life for shards {sorted(held)} only",
    )
    for key in every:
        starts = lines(key, "start")
        assert len(starts) <= 1, (key, starts)
        record = dex.store.get_call(key)
        assert record is not None
        if record.status is CallStatus.SUCCEEDED:
            assert len(starts) == 1, key
        elif record.status is CallStatus.FAILED:
            # Expired in the queue behind the others (schedule-to-start): it never ran.
            assert (record.error or "").startswith(DID_NOT_RUN) and starts == [], record.error
        else:
            assert record.status is CallStatus.OUTCOME_UNKNOWN, (record.status, record.error)
