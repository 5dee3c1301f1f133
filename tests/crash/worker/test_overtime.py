"""An attempt past its start-to-close timeout: the failure is recorded, and what the old worker
returns later is evidence only, never the outcome (S5.1, S5.2).

The `overtime` tool (start-to-close 1.5 s) ignores its soft time limit and returns "late value"
after 4 s, as tool code that cannot be stopped would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex
from dex_celery.model.records import ToolCallRecord
from tests.support.faults.crash import (
    events,
    finished_events,
    lines,
    tool_messages,
    wait_finished,
    wait_late_result,
)

pytestmark = pytest.mark.crash

TIMEOUT_PREFIX = "the tool ran past its start-to-close timeout"


def _check_late(dex: Dex, key: str, final: ToolCallRecord) -> None:
    assert final.status is CallStatus.FAILED
    assert (final.error or "").startswith(TIMEOUT_PREFIX), final.error
    assert final.result is None
    late = json.loads(final.late_result or "{}")
    assert late["attempt"] == 1
    assert json.loads(late["payload"]) == "late value"
    assert [a for a, _, _ in lines(key, "start")] == [1]
    assert [a for a, _, _ in lines(key, "end")] == [1]  # the old worker did go on (S5.1)
    (message,) = tool_messages(dex, key)
    assert "late value" not in message
    assert finished_events(dex, key) == 1  # it follows the SQL commit: waited for, not raced
    (finished,) = events(dex, type_="tool_call_finished", key=key)
    assert finished["status"] == CallStatus.FAILED.value
    wait_for(
        lambda: events(dex, type_="tool_call_late_result", key=key),
        timeout=30,
        what="the tool_call_late_result event",
    )
    assert len(events(dex, type_="tool_call_late_result", key=key)) == 1


def test_overtime_attempt_fenced_by_the_sweeper_keeps_its_late_result_as_evidence(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """S5.1: the sweeper fences the attempt at start-to-close and records `failed` with the
    timeout error while the tool still runs; S5.2: the value it returns later is kept as
    `late_result` and announced, and status, error and result do not change."""
    start_worker()
    record = dex.client().request_call("s1", "t1", "c1", "overtime", {"seconds": 4})
    recorded = wait_finished(dex, record.key, timeout=30)
    assert recorded.status is CallStatus.FAILED, recorded
    assert (recorded.error or "").startswith(TIMEOUT_PREFIX), recorded.error
    assert lines(record.key, "end") == []  # recorded while the tool was still running

    final = wait_late_result(dex, record.key)
    assert (final.status, final.error, final.result, final.finished_at) == (
        recorded.status,
        recorded.error,
        recorded.result,
        recorded.finished_at,
    )
    _check_late(dex, record.key, final)


def test_overtime_attempt_finishing_before_any_sweep_is_still_a_timeout(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """S5.1, S5.2 with no sweeper running: the result arrives after the deadline but before anyone
    fenced the attempt; the finish script turns it into the timeout and keeps the value as
    evidence, so the outcome does not depend on whether a sweep happened to run in time."""
    start_worker()
    record = dex.client().request_call("s1", "t1", "c1", "overtime", {"seconds": 2.5})
    final = wait_finished(dex, record.key, timeout=30)
    if not final.late_result:
        final = wait_late_result(dex, record.key)
    _check_late(dex, record.key, final)
