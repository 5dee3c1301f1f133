"""The worker's link to Redis (its broker and its ledger) is cut and comes back: the worker's
main process survives and serves calls again (issue 19, finding 8; docs/operations.md).

The worker reaches a redis-server of this test's own through a TCP proxy the test cuts: every
established connection is reset, new ones are refused for a few seconds, then accepted again.
The proxy resets the pub/sub links first: the consumer then notices the loss while its `BRPOP`
is still pending, the order in which Kombu's teardown of the lost connection used to raise
`AttributeError("'NoneType' object has no attribute 'hostname'")` and end the worker with
"Unrecoverable error" (a real cut produces that order by chance: 2 of 4 runs in the issue).

Two witnesses, as in every crash test: the record (SQL) and the tool's own side-effect log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import CeleryBeat, RedisServer, Worker, wait_for
from devtools.toolapp import make_app
from dex_celery import CallStatus, Dex, Settings
from dex_celery.engine.counters import last_sweep
from dex_celery.testing.tcpproxy import TcpProxy
from tests.support.faults.crash import dex_with_sweeper, lines, wait_finished, wait_started

pytestmark = pytest.mark.crash

#: Long enough that no call expires while the worker reconnects (Kombu waits 2 s, then 4 s...).
SCHEDULE_TO_START = "90"
#: Seconds the proxy refuses connections after the cut.
REFUSED_FOR = 3.0
CUTS = 3


@pytest.fixture
def proxy(own_redis: RedisServer) -> Iterator[TcpProxy]:
    link = TcpProxy(own_redis.port).start()
    yield link
    link.stop()


@pytest.fixture
def link_env(env: dict[str, str], own_redis: RedisServer) -> dict[str, str]:
    return {**env, "DEX_REDIS_URL": own_redis.url, "DEX_SCHEDULE_TO_START": SCHEDULE_TO_START}


@pytest.fixture
def direct_dex(dex: Dex, link_env: dict[str, str]) -> Iterator[Dex]:
    """The test's Dex on the Redis itself (never through the proxy), with a sweeper running."""
    yield from dex_with_sweeper(link_env)


def _refuse_for(seconds: float, worker: Worker) -> None:
    """Keep the link down for `seconds` (the fault itself, not a wait for something), watching
    the worker meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not worker.died():
        time.sleep(0.05)


def _served_or_died(dex: Dex, key: str, worker: Worker) -> bool:
    record = dex.store.get_call(key)
    return worker.died() or (record is not None and record.finished)


@pytest.mark.parametrize("pool", ["prefork", "threads", "gevent"])
def test_a_cut_broker_link_leaves_the_worker_serving_calls(
    direct_dex: Dex,
    link_env: dict[str, str],
    proxy: TcpProxy,
    start_worker: Callable[..., Worker],
    pool: str,
) -> None:
    """Cut three times, with a read (acknowledged late: unacknowledged while it runs) and a
    non-idempotent write in flight: the same worker main process is there after each cut, a
    write requested after the cut runs exactly once and succeeds, and the writes in flight
    during the cut never ran twice (S3.2), whatever their record says."""
    dex = direct_dex
    worker = start_worker(
        concurrency=3, extra_env={**link_env, "DEX_REDIS_URL": proxy.url()}, pool=pool
    )
    main_pid = worker.pid
    client = dex.client()
    in_flight_writes: list[str] = []
    for cut in range(CUTS):
        # A session per cut: the same write again in one session, while an earlier one may
        # still be unsettled, would wait for a person (the repeat guard, S5.4).
        session = f"s{cut}"
        read = client.request_call(session, f"t{cut}", "read", "slow_read", {"seconds": 4})
        write = client.request_call(
            session, f"t{cut}", "write", "slow_non_idempotent_write", {"seconds": 4}
        )
        in_flight_writes.append(write.key)
        wait_started(read.key)
        wait_started(write.key)

        assert proxy.cut(subscribers_first=True) > 0
        _refuse_for(REFUSED_FOR, worker)
        assert not worker.died(), f"the worker exited during the cut:\n{worker.log()[-4000:]}"
        proxy.restore()

        after = client.request_call(
            session, f"t{cut}", "after", "slow_non_idempotent_write", {"seconds": 0}
        )
        wait_for(
            lambda key=after.key: _served_or_died(dex, key, worker),  # type: ignore[misc]
            timeout=60,
            what=f"the call after cut {cut + 1} to be served",
        )
        assert not worker.died(), (
            f"the worker's main process exited after cut {cut + 1}:\n{worker.log()[-4000:]}"
        )
        assert worker.pid == main_pid
        done = wait_finished(dex, after.key)
        assert done.status is CallStatus.SUCCEEDED, done.error
        assert len(lines(after.key, "start")) == 1
        for key in (read.key, write.key):
            wait_finished(dex, key, timeout=60)  # none stays pending

    assert "Unrecoverable error" not in worker.log()
    for key in in_flight_writes:
        assert len(lines(key, "start")) == 1, f"{key} ran more than once"


def test_a_worker_started_while_its_link_is_down_serves_once_it_is_back(
    direct_dex: Dex,
    link_env: dict[str, str],
    proxy: TcpProxy,
    start_worker: Callable[..., Worker],
) -> None:
    """`broker_connection_retry_on_startup` and no retry limit: a worker that cannot reach
    Redis when it starts waits for it rather than exiting, then serves a write once."""
    dex = direct_dex
    proxy.cut()
    worker_env = {**link_env, "DEX_REDIS_URL": proxy.url()}
    restore = threading.Timer(REFUSED_FOR * 2, proxy.restore)
    restore.start()
    try:
        worker = start_worker(concurrency=1, extra_env=worker_env)
    finally:
        restore.join()
    record = dex.client().request_call(
        "s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 0}
    )
    done = wait_finished(dex, record.key, timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert len(lines(record.key, "start")) == 1
    assert not worker.died()


def test_the_proxy_resets_and_refuses(own_redis: RedisServer, tmp_path: Path) -> None:
    """The proxy itself: a cut resets open links and refuses new ones until restored."""
    import redis

    link = TcpProxy(own_redis.port).start()
    try:
        client = redis.Redis(port=link.port, socket_timeout=2)
        assert client.ping()
        assert link.cut() == 1
        with pytest.raises(redis.ConnectionError):
            redis.Redis(port=link.port, socket_connect_timeout=1).ping()
        link.restore()
        assert redis.Redis(port=link.port, socket_connect_timeout=1).ping()
    finally:
        link.stop()


def test_beat_outlives_a_cut_link_and_sweeps_again(
    dex: Dex, link_env: dict[str, str], proxy: TcpProxy, tmp_path: Path
) -> None:
    """Beat (the reconcile schedule and the sweeper thread) reaches Redis through the proxy:
    after a cut it is still running and its sweeper records sweeps again."""
    _app, direct = make_app(Settings.from_env(link_env))
    beat = CeleryBeat(
        "devtools.toolapp", {**link_env, "DEX_REDIS_URL": proxy.url()}, tmp_path / "beat"
    ).start()
    try:
        wait_for(lambda: last_sweep(direct.ledger), timeout=30, what="a first sweep")
        for _ in range(2):
            assert proxy.cut(subscribers_first=True) >= 0
            deadline = time.monotonic() + REFUSED_FOR
            while time.monotonic() < deadline and not beat.died():
                time.sleep(0.05)
            proxy.restore()
            cut_at = direct.ledger.now()

            def swept_after(since: float = cut_at) -> bool:
                assert not beat.died(), f"beat exited:\n{beat.log()[-4000:]}"
                sweep = last_sweep(direct.ledger)
                return sweep is not None and sweep.finished_at > since

            wait_for(swept_after, timeout=60, what="beat's sweeper to sweep after the cut")
        assert not beat.died()
    finally:
        beat.stop()
