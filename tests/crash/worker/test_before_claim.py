"""A message delivered to a worker that is SIGKILLed before the claim: the tool did not run, and
the record says so (S3.3, S4.2); a read is retried and succeeds (S3.1).

The worker is started with `DEX_TEST_BLOCK_BEFORE_CLAIM=1`: every tool task then blocks in
Celery's `task_prerun` (in the pool child, after delivery, before `run_attempt`'s claim) and
writes a marker file, so the kill lands exactly between delivery and claim.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import BLOCK_BEFORE_CLAIM_ENV, VISIBILITY_TIMEOUT_ENV, prerun_marker
from dex_celery import DID_NOT_RUN, CallStatus, Dex
from dex_celery.model.ids import CallKey
from tests.support.faults.crash import (
    finished_events,
    lines,
    refused,
    tool_messages,
    wait_finished,
)

pytestmark = pytest.mark.crash


def test_worker_killed_between_delivery_and_claim(
    dex: Dex,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    """S4.2: a write whose only attempt reached a worker process but not the claim ends `failed`
    with the exact did-not-run prefix, and the tool log is empty. S3.1: a read in the same spot
    expires and is retried as attempt 2 on a new worker; the broker's later redelivery of the
    unacknowledged attempt-1 message cannot claim (S3.3)."""
    blocked = start_worker(extra_env={BLOCK_BEFORE_CLAIM_ENV: "1"})
    client = dex.client()
    write = client.request_call("s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 0})
    read = client.request_call("s1", "t1", "r", "echo", {"q": 1})
    for record in (write, read):
        marker = prerun_marker(CallKey.parse(record.key).task_id(1))
        wait_for(
            marker.exists,
            timeout=30,
            what=f"attempt 1 of {record.key} to be delivered to a pool process",
        )
    assert dex.ledger.read(write.key).state == "enqueued"  # type: ignore[union-attr]

    blocked.kill_all()

    # The write: expires at its schedule-to-start deadline; never ran, safe to call again.
    done = wait_finished(dex, write.key, timeout=30)
    assert done.status is CallStatus.FAILED, done
    assert (done.error or "").startswith(DID_NOT_RUN), done.error
    assert lines(write.key, "start") == []
    (message,) = tool_messages(dex, write.key)
    assert DID_NOT_RUN in message
    assert finished_events(dex, write.key) == 1

    # The read: attempt 1 expired too and attempt 2 waits in the queue; a new worker (with a
    # broker that gives back the dead worker's unacknowledged attempt-1 message) runs it.
    wait_for(
        lambda: getattr(dex.ledger.read(read.key), "attempt", 0) == 2,
        timeout=30,
        what="the read's attempt 1 to expire and attempt 2 to be published",
    )
    fresh = start_worker(extra_env={VISIBILITY_TIMEOUT_ENV: "1"})
    done = wait_finished(dex, read.key, timeout=30)
    assert done.status is CallStatus.SUCCEEDED, done
    # Attempt 2, or a later one where attempt 2 also expired in the queue while the new worker
    # started on a loaded machine: either way the tool ran once, in the attempt that ended it.
    assert done.attempts >= 2
    assert lines(read.key, "start") == [(done.attempts, lines(read.key, "start")[0][1], read.key)]
    redelivered = f"Task dex.tool.echo[{read.key}#1] received"
    wait_for(
        lambda: redelivered in fresh.log() and refused(dex, read.key) >= 1,
        timeout=30,
        what="the redelivered attempt-1 message to be refused",
    )
    # Still the one start of the attempt that ended it: the redelivered attempt 1 ran nothing.
    assert [a for a, _, _ in lines(read.key, "start")] == [done.attempts]
    assert finished_events(dex, read.key) == 1
