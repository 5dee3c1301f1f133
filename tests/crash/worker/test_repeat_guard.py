"""The repeat guard (S5.4) with real workers: issue 21's reproduction runs the write once.

Turn 1's `charge` of order A-1 (a `non_idempotent_write` needing no approval, start-to-close
2 s) ignores its time limit and runs on for 5 s; it is recorded `failed` while it runs. Turn 2
asks for the same charge with a new tool-call id. Before the guard both ran and the order was
charged twice; now turn 2 waits for a person with the reason, the late result of turn 1 is
announced to it, its deadline rejects it with a text saying the earlier call may have taken
effect, and the tool's own side-effect log shows one charge. On prefork and threads workers, on
SQLite and PostgreSQL. A killed worker's `outcome_unknown` write holds its repeats the same way
until it is reconciled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import charges, make_app
from dex_celery import CallStatus, Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever
from dex_celery.ops.present import call_details, render_details
from tests.support.faults.crash import events, lines, wait_finished, wait_late_result, wait_started
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [pytest.mark.crash, ON_BOTH_DATABASES]

TIMEOUT_PREFIX = "the tool ran past its start-to-close timeout"


@pytest.fixture
def swept(dex: Dex) -> Iterator[Dex]:
    """`dex` (schema made) with the sweeper loop running in this process."""
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(dex,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    yield dex
    stop.set()
    thread.join(timeout=15)


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_timed_out_write_repeated_next_turn_runs_once(
    pool: str, swept: Dex, start_worker: Callable[..., Worker]
) -> None:
    dex = swept
    start_worker(pool=pool)
    client = dex.client()
    turn1 = client.request_call(
        "s1", "t1", "call-1", "charge_order", {"order": "A-1", "seconds": 5}
    )
    failed = wait_finished(dex, turn1.key, timeout=30)
    assert failed.status is CallStatus.FAILED
    assert (failed.error or "").startswith(TIMEOUT_PREFIX), failed.error
    assert lines(turn1.key, "end") == [], "recorded while the tool still runs"

    turn2 = client.request_call(
        "s1", "t2", "call-1", "charge_order", {"order": "A-1", "seconds": 5}
    )
    assert turn2.status is CallStatus.AWAITING_APPROVAL, turn2
    assert turn2.repeat_of == turn1.key
    assert turn2.repeat_reason == f"an identical call {turn1.key} may still be running"
    (held,) = events(dex, type_="tool_call_repeat_held", key=turn2.key)
    assert held["earlier"] == turn1.key
    shown = render_details(call_details(dex, turn2))
    assert f"held back: an identical call {turn1.key} may still be running" in shown

    # Turn 1's attempt finishes: its late result is kept and announced to the waiting call.
    late = wait_late_result(dex, turn1.key)
    assert late.status is CallStatus.FAILED
    wait_for(
        lambda: bool(events(dex, type_="tool_call_repeat_evidence", key=turn2.key)),
        timeout=15,
        what="the late result's evidence announced to the held-back call",
    )
    (pending,) = client.pending_approvals()
    assert pending.repeat is not None and pending.repeat.late_result
    assert "late result has arrived" in pending.repeat.now_text

    # Nobody approves: the deadline rejects it, and the model reads that A-1 may be charged.
    rejected = wait_finished(dex, turn2.key, timeout=30)
    assert rejected.status is CallStatus.REJECTED
    assert turn1.key in (rejected.error or "") and "may have taken effect" in (rejected.error or "")
    assert lines(turn2.key, "start") == []
    assert len(charges("A-1")) == 1, charges("A-1")


def test_a_killed_workers_unknown_write_holds_repeats_until_reconciled(
    env: dict[str, str], swept: Dex, start_worker: Callable[..., Worker]
) -> None:
    """A write whose worker was SIGKILLed mid-call is `outcome_unknown`: its repeat waits with
    "may have taken effect; its outcome is not reconciled yet" until the reconciliation reports
    it, which the waiting call is told of; the next repeat then passes and runs."""
    _app, checker = make_app(Settings.from_env(env))
    checker.register_outcome_check("charge_order", lambda key, arguments: f"{key}: A-2 was charged")
    worker = start_worker()
    client = swept.client()
    turn1 = client.request_call(
        "s1", "t1", "call-1", "charge_order", {"order": "A-2", "seconds": 1.5}
    )
    wait_started(turn1.key)
    worker.kill_all()
    unknown = wait_finished(swept, turn1.key, timeout=30)
    assert unknown.status is CallStatus.OUTCOME_UNKNOWN, unknown

    turn2 = client.request_call(
        "s1", "t2", "call-1", "charge_order", {"order": "A-2", "seconds": 1.5}
    )
    assert turn2.status is CallStatus.AWAITING_APPROVAL
    assert turn2.repeat_reason == (
        f"an identical call {turn1.key} may have taken effect; its outcome is not reconciled yet"
    )
    checker.runtime.reconciler.reconcile_call(unknown, "")
    (evidence,) = events(swept, type_="tool_call_repeat_evidence", key=turn2.key)
    assert evidence["evidence"] == "reconciled"

    start_worker()
    turn3 = client.request_call(
        "s1", "t3", "call-1", "charge_order", {"order": "A-2", "seconds": 0}
    )
    assert turn3.status is CallStatus.PENDING and turn3.repeat_of is None
    assert wait_finished(swept, turn3.key, timeout=30).status is CallStatus.SUCCEEDED
    assert lines(turn2.key, "start") == []
