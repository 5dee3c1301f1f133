"""docs/ledger.md crash table, "after finish script, before SQL write": the ledger holds the outcome
and the sweeper writes it, exactly once.

The worker's outcome writer is stalled by a test hook, so each finished outcome stays in the
ledger only, as if the process had died right after its finish script; then the whole worker
is SIGKILLed. S4.1: the call still ends with exactly one record, and S7.3 one finished event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import STALL_WRITER_ENV, executions
from dex_celery import CallStatus, Dex
from tests.support.faults.crash import finished_events, release_tools, tool_messages, wait_finished

pytestmark = pytest.mark.crash


def test_outcome_decided_but_not_written_is_recorded_by_the_sweeper(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker(extra_env={STALL_WRITER_ENV: "1"})
    client = dex.client()
    record = client.request_call("s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 0})
    release_tools(env)

    # The ledger decided the outcome; SQL does not have it.
    wait_for(
        lambda: (entry := dex.ledger.read(record.key)) is not None and entry.status == "succeeded",
        timeout=30,
        what="the ledger to hold the outcome",
    )
    assert client.get_call(record.key).status is CallStatus.PENDING
    worker.kill_all()

    stop = threading.Event()
    from dex_celery.engine.upkeep.sweep import run_forever

    sweeper = threading.Thread(target=run_forever, args=(dex,), kwargs={"stop": stop})
    sweeper.start()
    try:
        done = wait_finished(dex, record.key, timeout=30)
    finally:
        stop.set()
        sweeper.join(timeout=10)

    assert done.status is CallStatus.SUCCEEDED
    assert done.result == '"done"'
    assert len(tool_messages(dex, record.key)) == 1
    assert finished_events(dex, record.key) == 1
    assert [line.split()[0] for line in executions(record.key)] == ["start", "end"]
