"""A tool whose policy lease is shorter than the deployment's is kept alive while healthy (S3.4).

The worker's heartbeat thread must renew every running attempt within its own lease, however
long the thread slept while the process was idle or busy with calls of longer leases.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from devtools.processes import Worker
from dex_celery import CallStatus, Dex
from tests.support.faults.crash import lines, wait_finished

#: The deployment's heartbeat timeout: the idle heartbeat thread used to sleep a third of this.
GLOBAL_HEARTBEAT = "30"
#: How long the short-lease tools run; five of their 2 s leases.
RUN_SECONDS = 10.0


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "DEX_HEARTBEAT_TIMEOUT": GLOBAL_HEARTBEAT}


def test_policy_heartbeat_shorter_than_global_keeps_a_healthy_call_alive(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """Policy `heartbeat_timeout=2` under a global 30 s, 10 s of healthy work: `succeeded`, and
    the tool ran once. A quick call first leaves the process's heartbeat thread idle, as in a
    worker that has served other calls; both effect classes, since a lapse would end the write
    `outcome_unknown` and run the read twice."""
    assert dex.settings.heartbeat_timeout == float(GLOBAL_HEARTBEAT)
    start_worker(concurrency=2)
    client = dex.client()
    warm = [client.request_call("s1", "t0", f"warm{i}", "echo", {"i": i}) for i in range(2)]
    for record in warm:
        assert wait_finished(dex, record.key, timeout=30).status is CallStatus.SUCCEEDED

    calls = [
        client.request_call("s1", "t1", name, name, {"seconds": RUN_SECONDS})
        for name in ("short_lease_read", "short_lease_non_idempotent_write")
    ]
    for record in calls:
        assert record.policy.heartbeat_timeout == 2.0
    for record in calls:
        done = wait_finished(dex, record.key, timeout=RUN_SECONDS + 30)
        assert done.status is CallStatus.SUCCEEDED, done.error
        assert done.attempts == 1
        assert [a for a, _, _ in lines(record.key, "start")] == [1]
        assert [a for a, _, _ in lines(record.key, "end")] == [1]
