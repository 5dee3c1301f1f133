"""End to end through a real prefork worker: a read succeeds, a tool error fails (S4.1)."""

from __future__ import annotations

import json
from collections.abc import Callable

from devtools.processes import Worker
from dex_celery import CallStatus, Dex


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
