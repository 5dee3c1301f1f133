"""`dex-celery calls list|show`, `sweep`, `reconcile`: what an operator reads, as text and JSON.

The calls are run by a real prefork worker; the commands run in-process through click's runner
against the test's `Dex` (swapped in for `devtools.toolapp:dex`), and once through the
installed `dex-celery` script in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from devtools.processes import ROOT, Worker
from dex_celery import CallStatus, Dex
from dex_celery.cli.main import main
from dex_celery.engine.attempt.owners import parse_owner
from dex_celery.tools.redact import REDACTED

APP = "devtools.toolapp:dex"
SECRET = "tok-5f1e-very-secret"


@pytest.fixture
def finished_calls(dex: Dex, start_worker: Callable[..., Worker]) -> dict[str, str]:
    """Three ended calls in two sessions: a success, a tool failure, a success with a secret."""
    start_worker()
    client = dex.client()
    keys = {
        "echo": client.request_call("s1", "t1", "c1", "echo", {"q": 1}).key,
        "failing": client.request_call("s1", "t1", "c2", "failing", {"message": "no order"}).key,
        "secret": client.request_call(
            "s2", "t1", "c1", "with_secret", {"query": "orders", "api_token": SECRET}
        ).key,
    }
    client.wait(list(keys.values()), timeout=60)
    return keys


def test_calls_list_shows_and_filters_calls_as_text_and_json(
    cli: Callable[..., Result], finished_calls: dict[str, str]
) -> None:
    """S4.1, S7.1: every call is listed with its one status; --status/--session filter; --json
    parses."""
    rows = json.loads(cli("calls", "list", "--json").output)
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) == set(finished_calls.values())
    assert by_key[finished_calls["echo"]]["status"] == "succeeded"
    assert by_key[finished_calls["echo"]]["effect"] == "read"
    assert by_key[finished_calls["failing"]]["status"] == "failed"
    assert by_key[finished_calls["failing"]]["error"] == "no order"

    failed = json.loads(cli("calls", "list", "--status", "failed", "--json").output)
    assert [r["key"] for r in failed] == [finished_calls["failing"]]
    s2 = json.loads(cli("calls", "list", "--session", "s2", "--json").output)
    assert [r["key"] for r in s2] == [finished_calls["secret"]]

    text = cli("calls", "list").output
    assert text.splitlines()[0].split() == [
        "KEY",
        "TOOL",
        "EFFECT",
        "STATUS",
        "ATTEMPTS",
        "REQUESTED",
        "ERROR",
    ]
    assert finished_calls["failing"] in text and "no order" in text
    assert cli("calls", "list", "--status", "rejected").output.strip() == "no calls"


def test_calls_show_gives_policy_attempts_and_messages(
    cli: Callable[..., Result], finished_calls: dict[str, str]
) -> None:
    """S1.5: the policy snapshot; S3.3: the attempt with the worker that claimed it and when;
    S4.4: the tool-result message the model read."""
    key = finished_calls["failing"]
    details = json.loads(cli("calls", "show", key, "--json").output)
    assert details["status"] == "failed"
    assert details["policy"]["effect"] == "idempotent_write"
    assert details["policy"]["effect_source"] == "policy"
    assert details["policy"]["max_attempts"] >= 1
    (attempt,) = details["attempt_log"]
    assert attempt["attempt"] == 1
    # The owner names the worker's node and process (engine/attempt/owners.py); `node`/`pid` show them.
    owner = parse_owner(attempt["owner"])
    assert "@" in owner.node and owner.pid is not None and owner.space
    assert (attempt["node"], attempt["pid"]) == (owner.node, owner.pid)
    assert attempt["claimed_at"] <= attempt["ended_at"]
    (message,) = details["messages"]
    assert message["role"] == "tool"
    assert message["tool_output"] == "Error: no order"
    assert details["late_result"] is None

    text = cli("calls", "show", key).output
    assert f"call      {key}" in text
    assert "policy    effect=idempotent_write" in text
    assert attempt["owner"] in text
    assert "Error: no order" in text


def test_calls_show_redacts_secret_arguments(
    cli: Callable[..., Result], finished_calls: dict[str, str]
) -> None:
    """S9.2: a value named in `secret_arguments` appears in no output, JSON or text."""
    key = finished_calls["secret"]
    as_json = cli("calls", "show", key, "--json").output
    details = json.loads(as_json)
    assert details["arguments"] == {"query": "orders", "api_token": REDACTED}
    assert details["status"] == CallStatus.SUCCEEDED.value
    assert SECRET not in as_json
    assert SECRET not in cli("calls", "show", key).output
    assert SECRET not in cli("calls", "list", "--json").output


def test_calls_show_of_an_unknown_key_is_a_clear_error(cli: Callable[..., Result]) -> None:
    """S9.3: a typed error, exit code 1, one line on stderr."""
    result = cli("calls", "show", "nope/t1/c1", code=1)
    assert "no tool call 'nope/t1/c1'" in result.output
    bad = cli("calls", "show", "not-a-key", code=1)
    assert "must be session/turn/call" in bad.output


def test_sweep_and_reconcile_run_one_pass(
    cli: Callable[..., Result], finished_calls: dict[str, str]
) -> None:
    """S8.4: one reconcile pass on demand (nothing unknown here: nothing surfaced or sent); the
    sweeper's report names every part of a sweep."""
    sweep = json.loads(cli("sweep", "--json").output)
    assert set(sweep) >= {"lost", "expired", "timed_out", "recorded", "approvals_expired"}
    assert sweep["errors"] == 0
    assert cli("sweep").output.startswith("sweep: ")
    report = json.loads(cli("reconcile", "--json").output)
    assert report["surfaced"] == 0 and report["reported"] == 0 and report["reports"] == []
    assert cli("reconcile").output.startswith("reconcile: surfaced=0")


def test_the_installed_script_lists_calls(
    env: dict[str, str], dex: Dex, finished_calls: dict[str, str]
) -> None:
    """The console script itself (a fresh process building its Dex from `DEX_*`) agrees."""
    script = Path(sys.executable).parent / "dex-celery"
    out = subprocess.run(
        [str(script), "--app", APP, "calls", "list", "--json"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert {r["key"] for r in json.loads(out.stdout)} == set(finished_calls.values())


def test_a_database_without_the_schema_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S9.3: a clear error (exit 1) naming the database and the fix, not a traceback."""
    import dex_celery.examples.orderdesk.app as reference
    from dex_celery import Settings

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    _app, dex, _desk = reference.create_app(Settings(database_url=url))
    monkeypatch.setattr(reference, "dex", dex)
    result = CliRunner().invoke(
        main, ["-A", "dex_celery.examples.orderdesk.app:dex", "calls", "list"]
    )
    assert result.exit_code == 1, result.output
    assert url in result.output
    assert "dex-celery -A dex_celery.examples.orderdesk.app:dex db upgrade" in result.output
    assert "Traceback" not in result.output


def test_sweep_loop_sweeps_until_ctrl_c(env: dict[str, str], dex: Dex, tmp_path: Path) -> None:
    """`sweep --loop` is the sweeper outside beat: it ends a call whose attempt nobody claims by
    its deadline (S4.2: failed, did not run), and stops cleanly on SIGINT."""
    import signal
    import time

    from dex_celery.model.outcomes import DID_NOT_RUN

    client = dex.client()
    # No worker runs: the one attempt of this write expires in the queue (schedule-to-start is
    # 5 s in the tests).
    record = client.request_call("s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 0})
    script = Path(sys.executable).parent / "dex-celery"
    log = tmp_path / "sweep.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(script), "--app", APP, "sweep", "--loop"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        (done,) = client.wait([record.key], timeout=60)
        assert done.status is CallStatus.FAILED
        assert (done.error or "").startswith(DID_NOT_RUN)
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, log.read_text()
        assert time.monotonic() - started < 30
        assert "sweeping every 0.2s" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
