"""The reconcile beat job: surface every new unknown call once, run registered checks, report
once, retry failing checks, leave calls without a check for a person (S8.1, S8.2, S8.4)."""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy

from devtools.processes import Worker, wait_for
from devtools.toolapp import executions, make_app
from dex_celery import (
    CallStatus,
    CannotTellYet,
    ConfigurationError,
    Dex,
    DuplicateOutcomeCheck,
    EventType,
    MessageRole,
    ReconcileReport,
    Settings,
    reconcile_once,
)
from dex_celery.engine.upkeep.reconcile import RECONCILE_TASK
from dex_celery.store.unknowns import UnknownOutcomes
from dex_celery.store.values import Outcome

SURFACED = EventType.TOOL_CALL_OUTCOME_UNKNOWN_SURFACED


def _kill_into_unknown(
    dex: Dex, start_worker: Callable[..., Worker], calls: dict[str, tuple[str, dict[str, Any]]]
) -> None:
    """Start each call on a real worker, SIGKILL it mid-run, wait for `outcome_unknown` (S4.3)."""
    worker = start_worker(concurrency=len(calls))
    client = dex.client()
    for key, (tool, arguments) in calls.items():
        session, turn, call = key.split("/")
        client.request_call(session, turn, call, tool, {"seconds": 60, **arguments})
    wait_for(lambda: all(executions(k) for k in calls), timeout=60, what="every tool to start")
    worker.kill_all()
    wait_for(
        lambda: all(
            (r := dex.store.get_call(k)) is not None and r.status is CallStatus.OUTCOME_UNKNOWN
            for k in calls
        ),
        timeout=60,
        what="outcome_unknown for every killed call",
    )


def _user_texts(dex: Dex, session: str) -> list[str]:
    return [
        m.text or ""
        for m in dex.client().get_agent_snapshot(session).messages
        if m.role == MessageRole.USER
    ]


def _surfaced_events(dex: Dex) -> list[str]:
    return [e.key for e in dex.client().events(types={SURFACED})]


def test_beat_job_reports_once_retries_failures_and_leaves_calls_without_a_check(
    dex: Dex,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """S8.4: run 1 surfaces all three unknown calls (log line with the key, event, count),
    reports the one whose check answers, logs the one whose check raises; run 2 (two runners at
    once) reports that one exactly once and surfaces nothing again; the call without a check is
    never reported and stays open; S8.2: later runs send nothing."""
    a, b, c = "shop/t1/order-1", "shop/t1/order-2", "shop/t1/other"
    _kill_into_unknown(
        dex,
        start_worker,
        {
            a: ("slow_non_idempotent_write", {"value": {"order": 1}}),
            b: ("slow_non_idempotent_write", {"value": {"order": 2}}),
            c: ("slow_unclassified", {}),
        },
    )
    asked: list[str] = []
    service_up = threading.Event()

    @dex.outcome_check("slow_non_idempotent_write")
    async def order_placed(key: str, arguments_json: str) -> str:
        asked.append(key)
        order = json.loads(arguments_json)["value"]["order"]
        if order == 2 and not service_up.is_set():
            raise ConnectionError("the order service is down")
        return f"Note from the order system: order {order} went through."

    caplog.set_level(logging.INFO, logger="dex_celery.engine.upkeep.reconcile")
    first = reconcile_once(dex)
    assert (first.surfaced, first.reported, first.errors, first.open_without_check) == (3, 1, 1, 1)
    assert set(first.surfaced_keys) == {a, b, c}
    assert first.reported_keys == (a,) and first.error_keys == (b,)
    surfaced_lines = [r.getMessage() for r in caplog.records if "call surfaced" in r.getMessage()]
    for key in (a, b, c):
        assert sum(key in line for line in surfaced_lines) == 1
    assert any(
        b in r.getMessage() and r.levelno == logging.ERROR and r.exc_info for r in caplog.records
    )
    assert sorted(_surfaced_events(dex)) == sorted([a, b, c])
    assert _user_texts(dex, "shop") == [
        f"Note from the order system: order 1 went through. (tool call {a})"
    ]
    repo = UnknownOutcomes(dex.store)
    failing = repo.get(b)
    assert failing is not None and failing.state == "open"
    assert failing.last_error == "ConnectionError: the order service is down"

    # The service recovers; two runners race (beat plus an operator, say).
    service_up.set()
    caplog.clear()
    reports: list[ReconcileReport] = []
    runners = [threading.Thread(target=lambda: reports.append(reconcile_once(dex))) for _ in "ab"]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join(timeout=60)
    assert sum(r.surfaced for r in reports) == 0
    assert sum(r.reported for r in reports) == 1
    assert sum(r.errors for r in reports) == 0
    assert _user_texts(dex, "shop") == [
        f"Note from the order system: order 1 went through. (tool call {a})",
        f"Note from the order system: order 2 went through. (tool call {b})",
    ]
    assert asked.count(a) == 1  # never asked again once reported
    assert not [r for r in caplog.records if "call surfaced" in r.getMessage()]

    # Later runs, through the Celery task beat runs, send nothing and surface nothing.
    third = dex.celery.tasks[RECONCILE_TASK]()
    assert third == ReconcileReport(open_without_check=1).as_dict()
    assert len(_user_texts(dex, "shop")) == 2
    assert sorted(_surfaced_events(dex)) == sorted([a, b, c])
    left = repo.get(c)
    assert left is not None and left.state == "open" and left.checks == 0
    assert dex.client().get_call(c).status is CallStatus.OUTCOME_UNKNOWN
    assert "dex-reconcile" not in dex.beat_schedule()  # it runs in the beat process itself


def test_a_check_answering_nonsense_is_a_typed_error_and_asked_again(
    dex: Dex,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """S9.3, S8.4: a check returning non-text, empty text or an oversized report is logged as
    `InvalidCheckResult` / `InvalidText` and asked again next run; `CannotTellYet` waits
    quietly; the first usable answer is reported once."""
    key = "desk/t1/call-1"
    _kill_into_unknown(dex, start_worker, {key: ("slow_unclassified", {})})
    limit = dex.settings.max_text_bytes
    answers: list[object] = [
        42,
        {"status": "placed"},
        "   ",
        CannotTellYet("the ledger is being rebuilt"),
        "x" * limit,
        "Note from the help desk: the ticket was opened.",
    ]
    dex.register_outcome_check("slow_unclassified", lambda k, args: answers.pop(0))
    caplog.set_level(logging.INFO, logger="dex_celery.engine.upkeep.reconcile")

    outcomes = []
    for _ in range(6):
        caplog.clear()
        report = reconcile_once(dex)
        outcomes.append((report.errors, report.cannot_tell_yet, report.reported))
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == report.errors
        if report.errors:
            assert key in errors[0]
    assert outcomes == [(1, 0, 0), (1, 0, 0), (1, 0, 0), (0, 1, 0), (1, 0, 0), (0, 0, 1)]
    assert _user_texts(dex, "desk") == [
        f"Note from the help desk: the ticket was opened. (tool call {key})"
    ]
    state = UnknownOutcomes(dex.store).get(key)
    assert state is not None and state.state == "reported" and state.checks == 6
    assert reconcile_once(dex) == ReconcileReport()


def test_check_registry_refuses_bad_registrations(dex: Dex) -> None:
    """S9.3 for configuration: one check per tool, a name, and something callable."""

    async def check(key: str, arguments_json: str) -> str:
        return "done"

    dex.register_outcome_check("slow_unclassified", check)
    with pytest.raises(DuplicateOutcomeCheck):
        dex.register_outcome_check("slow_unclassified", check)
    with pytest.raises(ConfigurationError):
        dex.register_outcome_check("", check)
    with pytest.raises(ConfigurationError):
        dex.register_outcome_check("echo", "not a function")  # type: ignore[arg-type]
    assert dex.outcome_checks.get("slow_unclassified") is check


@pytest.mark.postgres
def test_reconcile_bookkeeping_on_postgresql(env: dict[str, str]) -> None:
    """S8.2, S8.4 on PostgreSQL: the surfacing insert and the report transaction hold with two
    runners at once (the kill path itself is covered above on SQLite; here the call is ended
    `outcome_unknown` through the store, as the sweeper would)."""
    base = os.environ["DEX_TEST_POSTGRES_URL"]
    schema = f"dex_reconcile_{uuid.uuid4().hex[:8]}"
    admin = sqlalchemy.create_engine(base)
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    try:
        url = f"{base}?options=-csearch_path%3D{schema}"
        _app, dex = make_app(Settings.from_env(env, database_url=url))
        dex.store.create_schema()
        record = dex.client().request_call("pg", "t1", "c1", "slow_unclassified", {"seconds": 1})
        assert dex.store.record_outcome(
            record.key, Outcome(CallStatus.OUTCOME_UNKNOWN, "the worker stopped")
        )
        dex.register_outcome_check("slow_unclassified", lambda key, args: "Note: it ran.")
        reports: list[ReconcileReport] = []
        runners = [
            threading.Thread(target=lambda: reports.append(reconcile_once(dex))) for _ in "ab"
        ]
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join(timeout=60)
        assert sum(r.surfaced for r in reports) == 1
        assert sum(r.reported for r in reports) == 1
        assert _user_texts(dex, "pg") == [f"Note: it ran. (tool call {record.key})"]
        assert reconcile_once(dex) == ReconcileReport()
        dex.store.engine.dispose()
    finally:
        with admin.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()
