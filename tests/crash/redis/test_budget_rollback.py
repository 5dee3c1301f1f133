"""A write budget across a Redis rollback (S13.1.4, S10.2): Redis restarts from an older RDB
snapshot that holds fewer reservations than were made; the next call is judged on the scope
counted again from SQL, conservatively, never on the older data, so no more writes are admitted
than the budget allows. Real prefork workers; two witnesses: the records and the tools' log.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from devtools.processes import RedisServer, Worker
from dex_celery import CallStatus, Dex
from tests.support.faults.crash import lines, release_tools, wait_finished, wait_started

pytestmark = pytest.mark.crash

TOOL = "slow_non_idempotent_write"
LIMIT = 2


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "DEX_BUDGETS": f"writes: tools={TOOL} limit={LIMIT} label=writes"}


def test_a_rollback_never_admits_more_than_the_budget(
    own_dex: Dex,
    own_redis: RedisServer,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
) -> None:
    start_worker(concurrency=3, extra_env={"DEX_REDIS_URL": own_redis.url})
    client = own_dex.client()
    first = client.request_call("s", "t1", "w1", TOOL, {"seconds": 120})
    wait_started(first.key)
    # The snapshot holds one reservation of the two about to be made.
    redis.Redis.from_url(own_redis.url).save()
    second = client.request_call("s", "t1", "w2", TOOL, {"seconds": 120})
    assert second.status is CallStatus.PENDING
    wait_started(second.key)

    own_redis.restart()  # back to the older snapshot: one reservation, not two

    third = client.request_call("s", "t2", "w3", TOOL, {"seconds": 0.05})
    assert third.status is CallStatus.AWAITING_APPROVAL, third
    assert third.budget_reason is not None
    assert third.budget_reason.startswith("2 of 2 writes in this session"), third.budget_reason

    release_tools(env)
    for record in (first, second):
        wait_finished(own_dex, record.key)
    # What SQL admitted, and what the tools ran: never more than the budget.
    admitted = [
        r
        for r in (own_dex.store.get_call(k) for k in (first.key, second.key, third.key))
        if r is not None and r.status is not CallStatus.AWAITING_APPROVAL
    ]
    assert len(admitted) == LIMIT
    assert not lines(third.key, "start")
    assert sum(len(lines(r.key, "start")) for r in (first, second)) == LIMIT
