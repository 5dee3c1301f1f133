"""A prune killed mid-run loses nothing, and workers keep running calls beside it (S12.4;
docs/operations.md, "Retention").

Old history is written in bulk; a real `dex-celery history prune` (small batches) is killed
with SIGKILL once it reports progress, i.e. once it has archived and deleted part of the
history. Every old call is then whole in SQL (row and TOOL message as written) or whole in the
archive (or both), never in neither. A second prune finishes the job: no old call is left in
SQL, each is in the archive, the counts behind /metrics equal a grouped scan. Throughout both
runs a real prefork worker runs calls requested in a loop; every one of them succeeds, once.
On SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from devtools.history_seed import seed_history
from devtools.processes import ROOT, Worker
from devtools.toolapp import executions
from dex_celery import CallStatus, Dex
from dex_celery.store.archive import read_archive
from dex_celery.store.schema import messages, tool_calls
from dex_celery.store.views import OperatorViews
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [pytest.mark.crash, ON_BOTH_DATABASES]

APP = "devtools.toolapp:dex"
OLD_CALLS = 3000


def snapshot(dex: Dex) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Old calls by key, and their TOOL messages by call key."""
    with dex.store.engine.connect() as conn:
        calls = {
            r["key"]: dict(r)
            for r in conn.execute(
                select(tool_calls).where(tool_calls.c.key.like("old-%"))
            ).mappings()
        }
        tool = {
            r["call_key"]: dict(r)
            for r in conn.execute(
                select(messages).where(messages.c.call_key.like("old-%"))
            ).mappings()
        }
    return calls, tool


class Requester:
    """Requests `echo` calls in a loop (a new session every ten) until stopped."""

    def __init__(self, dex: Dex) -> None:
        self.client = dex.client()
        self.keys: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            record = self.client.request_call(f"live-{n // 10}", "t", f"c{n}", "echo", {"n": n})
            self.keys.append(record.key)
            n += 1
            time.sleep(0.01)

    def __enter__(self) -> Requester:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def prune_command(archive: Path) -> list[str]:
    script = Path(sys.executable).parent / "dex-celery"
    return [
        str(script),
        "-A",
        APP,
        "history",
        "prune",
        "--before",
        "1d",
        "--archive",
        str(archive),
        "--batch",
        "10",
    ]


def test_a_prune_killed_mid_run_loses_nothing_while_a_worker_runs_calls(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    seed_history(dex.store.engine, count=OLD_CALLS, requested_at=time.time() - 3 * 86400)
    calls, tool = snapshot(dex)
    assert len(calls) == len(tool) == OLD_CALLS
    archive = tmp_path / "history.jsonl.gz"
    start_worker()

    with Requester(dex) as requester:
        process = subprocess.Popen(
            prune_command(archive),
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stderr is not None
            first = process.stderr.readline()  # "removing what ended before ..."
            progress = process.stderr.readline()  # after the first batch was deleted
            assert "so far" in progress, (first, progress, process.stdout)
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)

        # Killed mid-run: part of the history is gone from SQL, and each call is whole in one
        # place (or in both), none in neither.
        left, left_tool = snapshot(dex)
        archived = {r["key"]: r for r in read_archive(archive) if r["kind"] == "call"}
        assert 0 < len(left) < OLD_CALLS, "the prune was not killed mid-run"
        for key, row in calls.items():
            assert key in left or key in archived, f"{key} is lost"
            if key in left:
                assert left[key] == row and left_tool[key] == tool[key]
            if key in archived:
                assert archived[key]["call"] == row
                assert archived[key]["messages"] == [tool[key]]

        finished = subprocess.run(
            prune_command(archive),
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert finished.returncode == 0, finished.stderr
        assert finished.stdout.startswith("history prune: removed "), finished.stdout

    left, _ = snapshot(dex)
    assert left == {}
    archived = {r["key"]: r for r in read_archive(archive) if r["kind"] == "call"}
    assert set(archived) == set(calls)
    assert all(archived[k]["call"] == row for k, row in calls.items())

    # The calls run beside both prunes all ended well, each run once.
    assert len(requester.keys) > 10
    done = dex.client().wait(requester.keys, timeout=120)
    assert {r.status for r in done} == {CallStatus.SUCCEEDED}
    assert all(len(executions(k)) == 1 for k in requester.keys)
    views = OperatorViews(dex.store)

    def group(c: Any) -> tuple[str, str, str]:
        return (c.tool, c.effect, c.status)

    assert sorted(views.count_by_outcome(), key=group) == sorted(
        views.count_by_outcome_scan(), key=group
    )
