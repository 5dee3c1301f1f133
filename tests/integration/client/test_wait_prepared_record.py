"""`wait()` returns SQL's record, prepared while the recorder writes it (docs/ledger.md,
"Recording outcomes").

At the ledger's decision (`tool_call_ended`) a waiting caller reads the ledger entry and SQL's
pending record and builds the record the recorder is writing (`engine/decided_outcomes.py`); when
`tool_call_finished` announces the same status and error, that record is returned without
reading SQL again. Here the worker's recorder is held before its write (the `before_record`
pause point), so the order is certain: the caller's one SQL read sees the call pending, the
recorder writes after it, and what `wait()` returns must still equal, field for field, what SQL
holds, for each end the ledger decides: a success, a success after a retry (attempts and the
attempt log), a tool error, and a non-idempotent write (its write-fence claim is in the record).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex, ToolCallRecord
from dex_celery.client.dex_client import DexClient
from dex_celery.engine.attempt.pause_points import PausePoint
from tests.support.faults.crash import finished_events
from tests.support.faults.pauses import pauses_in

CASES = [
    ("echo", {"n": 1}, CallStatus.SUCCEEDED),
    ("flaky_read", {"fail_times": 1}, CallStatus.SUCCEEDED),
    ("failing", {"message": "no such order"}, CallStatus.FAILED),
    ("charge_order", {"order": "o-prepared"}, CallStatus.SUCCEEDED),
]


@pytest.mark.parametrize(("tool", "arguments", "status"), CASES, ids=[c[0] for c in CASES])
def test_wait_returns_the_record_sql_holds_prepared_before_the_recorder_wrote_it(
    dex: Dex,
    start_worker: Callable[..., Worker],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tool: str,
    arguments: dict[str, Any],
    status: CallStatus,
) -> None:
    pauses = pauses_in(tmp_path)
    start_worker(extra_env=pauses.env(PausePoint.BEFORE_RECORD))
    runtime = dex.runtime
    # This caller must not record the outcome itself while the recorder is held.
    monkeypatch.setattr(runtime, "settings", dataclasses.replace(runtime.settings, record_wait=60))
    reads: list[ToolCallRecord] = []
    real_get_call = DexClient.get_call

    def counted(self: DexClient, key: str) -> ToolCallRecord:
        record = real_get_call(self, key)
        reads.append(record)
        return record

    monkeypatch.setattr(DexClient, "get_call", counted)
    client = dex.client()
    requested = client.request_call("s-prep", "t1", "c1", tool, arguments)
    returned: list[ToolCallRecord] = []
    waiter = threading.Thread(target=lambda: returned.extend(client.wait([requested.key])))
    waiter.start()
    try:
        pauses.wait(PausePoint.BEFORE_RECORD, "the recorder to hold the decided outcome")
        wait_for(lambda: bool(reads), timeout=30, what="the caller to read the pending record")
    finally:
        pauses.release(PausePoint.BEFORE_RECORD)
    waiter.join(timeout=30)
    assert not waiter.is_alive()

    (record,) = returned
    stored = dex.store.get_call(requested.key)
    assert record == stored  # every field, as SQL holds it
    assert record.status is status and record.finished_at is not None
    # One read of SQL, taken while the call was still pending there: nothing was read back.
    assert [r.status for r in reads] == [CallStatus.PENDING]
    assert finished_events(dex, requested.key) == 1
