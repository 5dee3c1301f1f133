"""Flower shows our tasks as `dex.tool.<name>`, with the idempotency key and without secrets.

A real Flower process (`celery -A devtools.toolapp flower`) against the test Redis, a real
prefork worker, and Flower's HTTP API read the way an operator's script would (S9.1, S9.2).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import ROOT, Worker, wait_for
from devtools.toolapp import LOG_ENV, executions
from dex_celery import DID_NOT_RUN, CallStatus, Dex
from dex_celery.engine.attempt.owners import parse_owner
from dex_celery.store.unknowns import UnknownOutcomes
from dex_celery.tools.redact import REDACTED
from tests.support.processes.flower_process import Flower, _wait_until_flower_receives_events
from tests.support.processes.flower_process import flower as flower

pytest.importorskip("flower", reason="flower is not installed (pip install 'dex-celery[flower]')")

SECRET = "sk-live-0b5e7d1f-do-not-show"


def test_flower_shows_the_key_and_redacts_secret_arguments(
    dex: Dex, start_worker: Callable[..., Worker], flower: Flower
) -> None:
    """S9.1: tool attempts appear in Flower as `dex.tool.<name>`; the task id carries the
    idempotency key and attempt; S9.2: a `secret_arguments` value never reaches Flower."""
    start_worker()
    _wait_until_flower_receives_events(dex, flower)
    client = dex.client()
    record = client.request_call(
        "s1", "t1", "c1", "with_secret", {"query": "open orders", "api_token": SECRET}
    )
    (done,) = client.wait([record.key], timeout=30)
    assert done.status is CallStatus.SUCCEEDED
    task_id = f"{record.key}#1"

    def flower_has_it() -> dict[str, Any] | None:
        task = flower.tasks().get(task_id)
        return task if task and task.get("state") == "SUCCESS" and task.get("kwargs") else None

    wait_for(flower_has_it, timeout=30, what="Flower to show the finished task")
    task = flower_has_it()
    assert task is not None
    assert task["name"] == "dex.tool.with_secret"
    assert task["uuid"] == task_id
    assert f"'key': '{record.key}'" in task["kwargs"]
    assert "'query': 'open orders'" in task["kwargs"]
    assert f"'api_token': '{REDACTED}'" in task["kwargs"]

    _, everything = flower.get("/api/tasks")
    _, info = flower.get(f"/api/task/info/{urllib.request.quote(task_id, safe='')}")
    assert record.key in info
    for text in (everything, info, json.dumps(task)):
        assert SECRET not in text


def test_flower_api_needs_the_password(flower: Flower) -> None:
    """S9.2: Flower shows task arguments, so it answers nobody without credentials."""
    status, _ = flower.get("/api/tasks", auth=False)
    assert status == 401
    status, _ = flower.get("/api/tasks")
    assert status == 200


# --- Flower tells the truth: each task's state and result are its call's record ------------------


def _beat(env: dict[str, str], logfile: Path) -> subprocess.Popen[bytes]:
    """`celery beat` of the test app: it runs the reconcile loop in its own process."""
    args = [
        sys.executable, "-m", "celery", "-A", "devtools.toolapp", "beat", "-l", "info",
        "-s", str(logfile.with_suffix(".schedule")),
    ]  # fmt: skip
    with logfile.open("wb") as out:
        return subprocess.Popen(
            args,
            cwd=ROOT,
            env={**os.environ, **env, "DEX_RECONCILE_INTERVAL": "0.5"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _task(flower: Flower, task_id: str, state: str, says: str = "") -> dict[str, Any]:
    """The task once Flower shows it in `state`, with `says` in its exception or result."""
    found: dict[str, Any] = {}

    def shown() -> bool:
        found.clear()
        found.update(flower.tasks().get(task_id) or {})
        text = f"{found.get('exception') or ''} {found.get('result') or ''}"
        return found.get("state") == state and says in text

    wait_for(shown, timeout=30, what=f"Flower to show {task_id} as {state} {says!r}", interval=0.2)
    return found


def test_flower_state_and_result_match_the_records(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    flower: Flower,
    sweeper: object,
    tmp_path: Path,
) -> None:
    """SUCCESS only for `succeeded` (with the record's summary as result); FAILURE with the
    outcome's text for `failed` (tool error, did not run) and `outcome_unknown` (worker killed);
    RETRY for an attempt that was retried; REFUSED for a stale delivery; and the reconcile job,
    running in beat, never appears in the task list."""
    worker = start_worker(concurrency=1)
    _wait_until_flower_receives_events(dex, flower)
    client = dex.client()
    beat = _beat(env, tmp_path / "beat.log")
    try:
        ok = client.request_call("f", "t1", "ok", "echo", {"n": 1}).key
        bad = client.request_call(
            "f", "t1", "bad", "failing", {"message": "there is no order 9999"}
        ).key
        flaky = client.request_call("f", "t1", "flaky", "flaky_read", {"fail_times": 1}).key
        client.wait([ok, bad, flaky], timeout=30)

        task = _task(flower, f"{ok}#1", "SUCCESS")
        assert task["result"].startswith("'succeeded: ") and '"n": 1' in task["result"]
        task = _task(flower, f"{bad}#1", "FAILURE", "there is no order 9999")
        assert "failed: " in task["exception"]
        assert _task(flower, f"{flaky}#1", "RETRY")["exception"]
        assert _task(flower, f"{flaky}#2", "SUCCESS")

        # The worker is busy: a write queued behind it expires unrun, and its stale delivery
        # is refused later; Flower keeps the record's FAILURE.
        busy = client.request_call("f", "t2", "busy", "slow_read", {"seconds": 60}).key
        wait_for(lambda: _running(dex, busy), timeout=30, what="the busy call to run")
        unrun = client.request_call(
            "f", "t2", "unrun", "slow_non_idempotent_write", {"seconds": 0}
        ).key
        (record,) = client.wait([unrun], timeout=30)
        assert record.status is CallStatus.FAILED and record.error.startswith(DID_NOT_RUN)
        _task(flower, f"{unrun}#1", "FAILURE", DID_NOT_RUN)
        (Path(env[LOG_ENV]) / "release").write_text("go")
        client.wait([busy], timeout=30)
        wait_for(lambda: "claim refused" in worker.log(), timeout=30, what="the stale delivery")
        assert flower.tasks()[f"{unrun}#1"]["state"] == "FAILURE"

        # A delivery of an attempt the ledger does not hold is refused, and shows as such.
        dex.celery.send_task(
            "dex.tool.echo", kwargs={"key": ok, "attempt": 7, "arguments": {}}, task_id=f"{ok}#7"
        )
        _task(flower, f"{ok}#7", "REFUSED", "claim was refused")

        # Killed mid-call: the record is outcome_unknown, and so is Flower's text.
        (Path(env[LOG_ENV]) / "release").unlink()
        killed = client.request_call(
            "f", "t3", "killed", "slow_non_idempotent_write", {"seconds": 60}
        ).key
        # Killed once the tool itself runs (its own log says so): a worker killed between the
        # ledger claim and the write fence's SQL claim ran no tool code and ends "did not run".
        wait_for(lambda: executions(killed), timeout=30, what="the write's tool to start")
        entry = dex.ledger.read(killed)
        assert entry is not None
        pid = parse_owner(entry.owner).pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        (record,) = client.wait([killed], timeout=30)
        assert record.status is CallStatus.OUTCOME_UNKNOWN
        # Celery's own event for the dead pool process says only `ExceptionWithTraceback()`;
        # the worker's parent follows it with the record's text.
        task = _task(flower, f"{killed}#1", "FAILURE", "outcome_unknown")
        assert "may or may not have taken effect" in task["exception"]

        # Beat's reconcile loop surfaced the unknown call, and no housekeeping task is listed.
        wait_for(
            lambda: UnknownOutcomes(dex.store).get(killed) is not None,
            timeout=30,
            what="reconcile in beat",
        )
        names = {t.get("name") for t in flower.tasks().values()}
        assert "dex.reconcile" not in names and "dex.sweep" not in names
        assert beat.poll() is None
    finally:
        os.killpg(beat.pid, signal.SIGKILL)
        beat.wait(timeout=10)


def _running(dex: Dex, key: str) -> bool:
    entry = dex.ledger.read(key)
    return entry is not None and entry.state == "running"
