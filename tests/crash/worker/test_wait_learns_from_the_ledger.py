"""A caller learns an outcome when the ledger decides it, never waiting for the recorder (issue 25).

The worker's outcome recorder (prefork: `OutcomeChannel`) writes decided outcomes to SQL in
batches, off the tool's path. A test hook stalls it: it takes every outcome from the pool
processes and writes none. No sweeper runs, so nothing else writes them either. `DexClient.wait`
must still return each outcome (docs/ledger.md, "Recording outcomes"): it learns it from the
ledger (`tool_call_ended`) and, since the recorder has not written it within `record_wait`,
writes it itself (`wait(recorded=False)` returns the same records at once and writes nothing).
SQL stays the system of record: what `wait` returns is SQL's record, with one
TOOL message and one finished event per call (S4.1, S7.3), the tool ran once (its own log), and
`finished_at` is the ledger's time of the decision. Then the stalled recorder is SIGKILLed and
the sweeper runs: nothing is written twice.

The repeat guard (S5.4) judges an identical earlier call by the outcome the ledger decided, so a
repeat of a call that succeeded is not held as "may still be running" only because its record
has not reached SQL yet.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import STALL_RECORDER_ENV, charges, executions
from dex_celery import CallStatus, CallTimeout, Dex
from tests.support.faults.crash import (
    events,
    finished_events,
    stalled_recorder_writes,
    tool_messages,
)

pytestmark = pytest.mark.crash


def _decided_in_the_ledger(dex: Dex, keys: list[str]) -> bool:
    return all(
        (entry := dex.ledger.read(key)) is not None and entry.status == "succeeded" for key in keys
    )


def test_wait_returns_outcomes_a_stalled_recorder_holds_and_records_them_once(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    pid_file = tmp_path / "recorder.pid"
    records = stalled_recorder_writes(dex, start_worker, pid_file)
    client = dex.client()
    keys = [r.key for r in records]
    wait_for(
        lambda: _decided_in_the_ledger(dex, keys),
        timeout=60,
        what="the ledger to decide every outcome",
    )
    # Decided, but the recorder holds them: SQL still shows every call pending.
    assert all(dex.store.get_call(k).status is CallStatus.PENDING for k in keys)  # type: ignore[union-attr]
    decided_at = {k: dex.ledger.read(k).finished_at for k in keys}  # type: ignore[union-attr]

    # `recorded=False`: the outcomes at once, as SQL will hold them; this caller writes nothing.
    early = client.wait(keys, timeout=30, recorded=False)
    assert [r.status for r in early] == [CallStatus.SUCCEEDED] * 3
    assert all(dex.store.get_call(k).status is CallStatus.PENDING for k in keys)  # type: ignore[union-attr]

    done = client.wait(keys, timeout=30)
    assert done == early  # the record SQL holds is the one the ledger showed

    for key, record in zip(keys, done, strict=True):
        assert record.status is CallStatus.SUCCEEDED
        assert record.result == '"done"'
        assert record == dex.store.get_call(key)  # SQL's record, written before wait returned
        assert record.finished_at == pytest.approx(decided_at[key], abs=1e-3)
        assert len(tool_messages(dex, key)) == 1
        assert len(events(dex, type_="tool_call_ended", key=key)) == 1
        assert finished_events(dex, key) == 1
        assert [line.split()[0] for line in executions(key)] == ["start", "end"]

    # The stalled recorder dies with the outcomes it held; the sweeper finds nothing left.
    wait_for(pid_file.exists, timeout=10, what="the recorder's pid")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    for key in keys:  # out of the unrecorded index: the sweeper has nothing to write
        index = dex.keys.of(key).unrecorded_index
        assert dex.ledger.client.zscore(index, key) is None
    report = dex.sweeper.sweep_once()
    assert (report.recorded, report.errors) == (0, 0)
    for key in keys:
        assert dex.store.get_call(key) == done[keys.index(key)]
        assert len(tool_messages(dex, key)) == 1
        assert finished_events(dex, key) == 1


def test_a_repeat_of_a_write_decided_in_the_ledger_is_judged_by_its_outcome(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(extra_env={STALL_RECORDER_ENV: str(tmp_path / "recorder.pid")})
    client = dex.client()
    first = client.request_call("s2", "t1", "c1", "charge_order", {"order": "o-ledger"})
    wait_for(
        lambda: _decided_in_the_ledger(dex, [first.key]),
        timeout=60,
        what="the ledger to decide the first charge",
    )
    assert dex.store.get_call(first.key).status is CallStatus.PENDING  # type: ignore[union-attr]

    # The earlier identical charge succeeded (in the ledger): the repeat is not held back.
    repeat = client.request_call("s2", "t2", "c1", "charge_order", {"order": "o-ledger"})
    assert repeat.status is CallStatus.PENDING
    assert repeat.repeat_of is None

    # Both are recorded by the waiting caller (the recorder is stalled, no sweeper runs).
    waiter = threading.Thread(target=client.wait, args=([first.key, repeat.key],))
    waiter.start()
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert [dex.store.get_call(k).status for k in (first.key, repeat.key)] == [  # type: ignore[union-attr]
        CallStatus.SUCCEEDED,
        CallStatus.SUCCEEDED,
    ]
    assert len(charges("o-ledger")) == 2  # two calls the model asked for, each charged once


def test_an_end_sql_must_judge_is_left_to_its_record_without_polling(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """A write whose service's answer was lost ends `lost` in the ledger: an end the write fence
    may still judge (docs/ledger.md, "Recording outcomes"), so a caller never records it. With
    the recorder stalled and no sweeper, `wait` times out; meanwhile it asks the ledger about the
    call a few times (once after `record_wait`, then once a quiet second), never in a loop."""
    start_worker(extra_env={STALL_RECORDER_ENV: str(tmp_path / "recorder.pid")})
    client = dex.client()

    def reads() -> int:
        stats = dex.ledger.client.info("commandstats")
        return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))

    before = reads()
    record = client.request_call("s3", "t1", "c1", "lost_reply_write", {})
    with pytest.raises(CallTimeout):
        client.wait([record.key], timeout=4)  # the ledger decides while it waits
    entry = dex.ledger.read(record.key)
    assert entry is not None and entry.status == "outcome_unknown"
    assert reads() - before <= 12
    stored = dex.store.get_call(record.key)
    assert stored is not None and stored.status is CallStatus.PENDING  # nothing written by it
    for mode in ("ended", "finished"):
        assert len(events(dex, type_=f"tool_call_{mode}", key=record.key)) == (mode == "ended")
