"""A gevent worker at high concurrency gets broker pools sized for it (docs/operations.md,
"Worker pools and the broker's connections").

With Kombu's default of 10 Redis connections, a real `celery worker -P gevent -c 200` whose 200
tasks end at the same moment fails their late acks with `MaxConnectionsError` (docs/benchmarks.md,
section 14). dex-celery's `worker_init` sizes both pools for the concurrency; here 200 calls that
all end at the same moment succeed, and the worker's log shows no such error.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from sqlalchemy import func, select

from devtools.processes import Worker, wait_for
from devtools.toolapp import make_app
from dex_celery import CallRequest, Settings
from dex_celery.processes.broker_pools import size_broker_pools
from dex_celery.store.schema import tool_calls

CONCURRENCY = 200


def test_a_gevent_worker_at_200_acks_every_call(
    env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    # Deadlines for a busy machine (requester and worker alike): this test is about acks.
    roomy = {"DEX_SCHEDULE_TO_START": "120", "DEX_HEARTBEAT_TIMEOUT": "60"}
    _app, dex = make_app(Settings.from_env({**env, **roomy}))
    dex.store.create_schema()
    worker = start_worker(pool="gevent", concurrency=CONCURRENCY, extra_env=roomy)
    client = dex.client()
    # Every call ends at the same moment, once all 200 hold a slot: 200 late acks at once.
    at = time.time() + 6.0
    for start in range(0, CONCURRENCY, 50):
        client.request_calls(
            [
                CallRequest("s1", f"t{start}", f"c{i}", "until", {"at": at})
                for i in range(start, start + 50)
            ]
        )
    query = (
        select(tool_calls.c.status, func.count())
        .where(tool_calls.c.session_id == "s1", tool_calls.c.status != "pending")
        .group_by(tool_calls.c.status)
    )

    def ended() -> dict[str, int]:
        with dex.store.engine.connect() as conn:
            return {str(status): int(n) for status, n in conn.execute(query)}

    wait_for(lambda: sum(ended().values()) >= CONCURRENCY, timeout=60, what="200 records")
    assert ended() == {"succeeded": CONCURRENCY}
    # Every message acknowledged: Kombu's Redis transport keeps an unacked message in its
    # `unacked` hash until the ack; a failed ack leaves it there (to be redelivered).
    broker = redis.Redis.from_url(env["DEX_REDIS_URL"])
    wait_for(lambda: broker.hlen("unacked") == 0, timeout=30, what="every message acked")
    log = worker.log()
    assert "MaxConnectionsError" not in log, log[-3000:]
    assert "claim refused" not in log, log[-3000:]


@pytest.mark.parametrize(
    ("pool", "concurrency", "preset", "expected"),
    [
        ("gevent", 200, {}, {"max_connections": 400, "broker_pool_limit": 400}),
        ("threads", 50, {}, {"max_connections": 100, "broker_pool_limit": 100}),
        ("prefork", 200, {}, {}),
        ("solo", 1, {}, {}),
        ("gevent", 3, {}, {}),
        ("gevent", 200, {"max_connections": 50}, {"broker_pool_limit": 400}),
    ],
)
def test_only_in_process_pools_left_at_the_defaults_are_sized(
    pool: str, concurrency: int, preset: dict[str, int], expected: dict[str, int]
) -> None:
    from celery import Celery

    app = Celery("sized", set_as_current=False)
    app.conf.broker_transport_options = dict(preset)
    assert size_broker_pools(app, pool, concurrency) == expected
    options = app.conf.broker_transport_options
    assert options.get("max_connections") == expected.get(
        "max_connections", preset.get("max_connections")
    )
    assert app.conf.broker_pool_limit == expected.get("broker_pool_limit", 10)
