"""End to end through a real prefork worker: a read succeeds, a tool error fails (S4.1)."""

from __future__ import annotations

import json
from collections.abc import Callable

import redis

from devtools.processes import Worker
from dex_celery import CallStatus, Dex
from dex_celery.model.ids import CallKey


def test_read_call_succeeds_through_a_real_worker(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    client = dex.client()
    record = client.request_call("s1", "t1", "c1", "echo", {"q": 1})
    assert record.status is CallStatus.PENDING
    (done,) = client.wait([record.key], timeout=30)
    assert done.status is CallStatus.SUCCEEDED
    assert json.loads(done.result or "null") == {
        "key": "s1/t1/c1",
        "attempt": 1,
        "arguments": {"q": 1},
    }
    assert done.attempts == 1


def test_tool_error_is_failed_with_the_tools_message(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    client = dex.client()
    record = client.request_call("s1", "t1", "c2", "failing", {"message": "no such order"})
    (done,) = client.wait([record.key], timeout=30)
    assert done.status is CallStatus.FAILED
    assert done.error == "no such order"


def test_the_open_publishes_the_first_attempt_kombu_s_own_message(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """The broker is the ledger's Redis: the open script pushes the message Celery and Kombu
    built, once, with the entry (docs/ledger.md, "Opening a call"); a worker runs it as any."""
    broker = redis.Redis.from_url(dex.settings.redis_url)
    client = dex.client()
    record = client.request_call("s1", "t1", "c3", "echo", {"q": 3})
    again = client.request_call("s1", "t1", "c3", "echo", {"q": 3})  # the same call (S2.3)
    assert again.key == record.key
    queued = [json.loads(raw) for raw in broker.lrange("celery", 0, -1)]
    assert [m["headers"]["id"] for m in queued] == [CallKey.parse(record.key).task_id(1)]
    assert queued[0]["properties"]["delivery_info"]["routing_key"] == "celery"
    assert dex.ledger.read(record.key) is not None
    start_worker()
    (done,) = client.wait([record.key], timeout=30)
    assert done.status is CallStatus.SUCCEEDED and done.attempts == 1
