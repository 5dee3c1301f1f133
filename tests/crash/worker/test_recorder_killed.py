"""The outcome recorder (issue 25) SIGKILLed while outcomes are pending in it loses nothing.

With the prefork pool the pool processes hand each decided outcome to the worker's recorder
process (`OutcomeChannel`) instead of writing it to SQL themselves. A test hook makes the
recorder take outcomes but never write them; it is then SIGKILLed. docs/ledger.md crash table,
"after finish script, before SQL write": the ledger holds each outcome in its unrecorded index,
so the sweeper writes it. S4.1: every call ends with exactly one record, one TOOL message and
(S7.3) one finished event; the tool ran once (its own log). The worker goes on: a call finished
after the kill is recorded by its pool process itself, without the sweeper.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import executions
from dex_celery import CallStatus, Dex
from dex_celery.engine.upkeep.sweep import run_forever
from tests.support.faults.crash import (
    finished_events,
    release_tools,
    stalled_recorder_writes,
    tool_messages,
    wait_finished,
)

pytestmark = pytest.mark.crash


def test_outcomes_pending_in_a_killed_recorder_are_recorded_once(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    pid_file = tmp_path / "recorder.pid"
    records = stalled_recorder_writes(dex, start_worker, pid_file)
    client = dex.client()
    release_tools(env)

    # Every outcome decided in the ledger, none in SQL: they wait in the (stalled) recorder.
    wait_for(
        lambda: all(
            (entry := dex.ledger.read(r.key)) is not None and entry.status == "succeeded"
            for r in records
        ),
        timeout=60,
        what="the ledger to hold every outcome",
    )
    assert all(client.get_call(r.key).status is CallStatus.PENDING for r in records)
    wait_for(pid_file.exists, timeout=10, what="the recorder's pid")
    recorder = int(pid_file.read_text())
    os.kill(recorder, signal.SIGKILL)
    wait_for(
        lambda: (
            not Path(f"/proc/{recorder}").exists()
            or "Z" in Path(f"/proc/{recorder}/stat").read_text().rpartition(")")[2].split()[0]
        ),
        timeout=10,
        what="the recorder to die",
    )

    # The worker lives on; with its recorder gone, a pool process records its own outcome
    # (no sweeper runs yet, so nothing else could write it).
    after = client.request_call("s1", "t2", "c9", "slow_non_idempotent_write", {"seconds": 0})
    assert wait_finished(dex, after.key, timeout=60).status is CallStatus.SUCCEEDED

    stop = threading.Event()
    sweeper = threading.Thread(target=run_forever, args=(dex,), kwargs={"stop": stop})
    sweeper.start()
    try:
        done = [wait_finished(dex, r.key, timeout=60) for r in records]
    finally:
        stop.set()
        sweeper.join(timeout=10)

    for record, call in zip(records, done, strict=True):
        assert call.status is CallStatus.SUCCEEDED
        assert call.result == '"done"'
        assert len(tool_messages(dex, record.key)) == 1
        assert finished_events(dex, record.key) == 1
        assert [line.split()[0] for line in executions(record.key)] == ["start", "end"]
    assert len(tool_messages(dex, after.key)) == 1
    assert [line.split()[0] for line in executions(after.key)] == ["start", "end"]
