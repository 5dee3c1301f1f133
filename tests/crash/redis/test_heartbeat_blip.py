"""A network blip shorter than the lease stays inside dex-celery (issue 19, finding 6).

`ctx.heartbeat()` promises True while the attempt is ours and False once it is fenced; a
Redis client error is neither. A real prefork worker reaches its (private) Redis through a TCP
proxy that the test cuts for about a second (every connection reset, new ones refused) while a
non-idempotent write heartbeats in a loop: the write must run once, to its end, and succeed.
The broker goes straight to Redis, so only the ledger's link is cut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import RedisServer, Worker, wait_for
from devtools.toolapp import LOG_ENV, executions
from dex_celery import CallStatus, Dex
from dex_celery.testing.tcpproxy import TcpProxy
from tests.support.faults.crash import wait_finished

#: Seconds the link is cut: shorter than the tool's 3 s lease, longer than several beats.
BLIP = 1.0


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """A queue deadline well beyond the cuts: a delivery held at its claim by a cut link must
    not be ended by the sweeper meanwhile (the claim's own retry is under test)."""
    return {**env, "DEX_SCHEDULE_TO_START": "120"}


@pytest.fixture
def proxy(own_redis: RedisServer) -> Iterator[TcpProxy]:
    with TcpProxy(own_redis.port) as proxy:
        yield proxy


@pytest.mark.parametrize("fault", ["reset", "drop"])
@pytest.mark.usefixtures("env")
def test_a_heartbeating_write_survives_a_blip_shorter_than_its_lease(
    fault: str,
    own_dex: Dex,
    own_redis: RedisServer,
    proxy: TcpProxy,
    start_worker: Callable[..., Worker],
) -> None:
    """`reset`: every connection reset and new ones refused (the finding's fault); `drop`: the
    link forwards nothing for the blip, then delivers what it held (lost packets resent)."""
    worker = start_worker(
        concurrency=1,
        extra_env={"DEX_REDIS_URL": proxy.url(), "DEX_BROKER_URL": own_redis.url},
    )
    record = own_dex.client().request_call("s1", "t1", "c1", "heartbeating_write", {"seconds": 4})
    key = record.key
    wait_for(lambda: executions(key), timeout=30, what="the write to start")

    proxy.blip(BLIP, drop=fault == "drop").join()
    if fault == "reset":
        assert proxy.resets >= 1  # the worker's connections to Redis really were cut

    finished = wait_finished(own_dex, key, timeout=30)
    assert finished.status is CallStatus.SUCCEEDED, (finished.error, worker.log()[-3000:])
    runs = executions(key)
    assert [line.split()[0] for line in runs] == ["start", "end"], runs
    assert finished.attempts == 1
    assert "ConnectionError" not in (finished.error or "")


def test_a_write_that_ends_during_a_blip_is_recorded_succeeded(
    own_dex: Dex,
    env: dict[str, str],
    own_redis: RedisServer,
    proxy: TcpProxy,
    start_worker: Callable[..., Worker],
) -> None:
    """The same class of fault at the attempt's other end: the tool returns while the link is
    cut, so the worker's report of its end (`finish`) meets a reset connection. Tried again
    within the lease, the write is recorded succeeded, not left to lapse into outcome_unknown."""
    start_worker(
        concurrency=1,
        extra_env={"DEX_REDIS_URL": proxy.url(), "DEX_BROKER_URL": own_redis.url},
    )
    key = own_dex.client().request_call("s1", "t1", "c1", "heartbeating_write", {"hold": True}).key
    wait_for(lambda: executions(key), timeout=30, what="the write to start")

    restored = proxy.blip(BLIP)
    (Path(env[LOG_ENV]) / "release").touch()  # the tool returns while the link is cut
    wait_for(lambda: len(executions(key)) == 2, timeout=10, what="the tool to return")
    restored.join()

    finished = wait_finished(own_dex, key, timeout=30)
    assert finished.status is CallStatus.SUCCEEDED, finished.error
    assert [line.split()[0] for line in executions(key)] == ["start", "end"]
    assert finished.attempts == 1


#: Longer than redis-py's own retries of a refused connection (ten, backing off to about a
#: second each), so the claims really meet the fault: the worker's own retry must carry them.
CLAIM_CUT = 8.0


def test_deliveries_that_meet_a_cut_link_at_their_claim_run_once_it_is_back(
    own_dex: Dex,
    own_redis: RedisServer,
    proxy: TcpProxy,
    start_worker: Callable[..., Worker],
) -> None:
    """The same class of fault before any tool code: a read and a non-idempotent write reach
    the worker while its link to the ledger is cut, so their claims cannot reach Redis. The
    claim is tried again (a repeat with the same fence holds as the first, docs/ledger.md), so
    once the link is back each runs once and succeeds, long before the queue deadline would
    have let the sweeper end them; nothing is raised to Celery as an unexplained failure."""
    worker = start_worker(
        concurrency=2,
        extra_env={"DEX_REDIS_URL": proxy.url(), "DEX_BROKER_URL": own_redis.url},
    )
    proxy.cut()
    client = own_dex.client()
    keys = [
        client.request_call("s1", "t1", "read", "echo", {}).key,
        client.request_call("s1", "t1", "write", "slow_non_idempotent_write", {"seconds": 0}).key,
    ]
    wait_for(
        lambda: worker.log().count(" received") >= len(keys),
        timeout=30,
        what="both deliveries to reach the worker",
    )
    proxy.blip(CLAIM_CUT).join()  # the link stays cut for CLAIM_CUT more seconds

    for key in keys:
        finished = wait_finished(own_dex, key, timeout=30)
        assert finished.status is CallStatus.SUCCEEDED, (key, finished.error, worker.log()[-3000:])
        assert finished.attempts == 1, (key, worker.log()[-4000:])
        assert [line.split()[0] for line in executions(key)][:1] == ["start"], key
        assert len([line for line in executions(key) if line.startswith("start")]) == 1, key
    assert "raised unexpected" not in worker.log()
