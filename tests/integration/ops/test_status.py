"""`dex-celery status` and the worker's warnings about a broken deployment.

A deployment whose beat does not run the sweeper looks healthy from Celery's side while calls
stay `pending` for ever: the worker says so in its log, and `status` shows it with everything
else an operator checks first.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devtools.processes import Worker, wait_for
from devtools.toolapp import LOG_ENV
from dex_celery import Dex
from dex_celery.engine.worker_starts import (
    FORGET_AFTER,
    SILENT_WINDOW,
    read_starts,
    record_start,
)
from dex_celery.ops.status import workers_section
from dex_celery.store import migrate
from tests.support.processes.cli_run import APP, dead_redis, one_error_line, run


def test_a_worker_warns_without_sweeper(
    env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """No beat: the worker's log names it. (Without `dex-celery db upgrade` the worker does not
    start at all: tests/integration/processes/test_worker_readiness.py.)"""
    migrate.upgrade(env["DEX_DATABASE_URL"])
    worker = start_worker(concurrency=1)
    wait_for(lambda: "no sweeper is running" in worker.log(), timeout=30, what="a sweeper warning")
    assert "beat_schedule" in worker.log()


def test_status_shows_every_section(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    migrate.upgrade(dex.settings.database_url)
    worker = start_worker(concurrency=1)
    client = dex.client()
    client.request_call("s1", "t1", "c1", "guarded_write", {})  # waits for approval

    before = run("-A", APP, "status", "--json", env=env)
    assert before.returncode == 0, before.stderr
    report = json.loads(before.stdout)["sections"]
    assert report["last_sweep"]["state"] == "warn"
    assert "beat" in report["last_sweep"]["detail"]

    dex.sweeper.sweep_once()
    result = run("-A", APP, "status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    value = json.loads(result.stdout)
    sections = value["sections"]
    assert list(sections) == [
        "redis",
        "database",
        "workers",
        "last_sweep",
        "calls",
        "writes",
        "webhooks",
    ]
    assert sections["writes"]["state"] == "ok" and sections["writes"]["frozen"] == []
    assert sections["redis"]["state"] == "ok"
    assert sections["database"]["revision"] == migrate.head()
    assert any(node.startswith("w") and "@" in node for node in sections["workers"]["nodes"])
    assert sections["last_sweep"]["state"] == "ok"
    assert sections["calls"]["awaiting_approval"] == 1
    assert sections["calls"]["unknown_unreported"] == 0
    text = run("-A", APP, "status", env=env)
    assert text.returncode == 0 and "last_sweep" in text.stdout
    assert worker.log()


def test_status_with_redis_down_reports_it_and_exits_1(dex: Dex, env: dict[str, str]) -> None:
    result = run("-A", APP, "status", env={**env, "DEX_REDIS_URL": dead_redis()})
    line = one_error_line(result)
    assert "redis" in line
    assert "FAIL  redis" in result.stdout
    assert "database" in result.stdout  # the other sections are still there


def test_status_shows_each_worker_its_pid_uptime_and_restarts(
    dex: Dex, env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 19, "Workers come back": a worker started again under its node name (as `dev`,
    compose and systemd restart it) shows its new pid and one restart; once it is gone it is
    listed as not answering, and the section warns."""
    migrate.upgrade(dex.settings.database_url)
    name = f"status-{uuid.uuid4().hex[:6]}@%h"
    node = name.replace("%h", socket.gethostname())

    def workers() -> dict[str, Any]:
        result = run("-A", APP, "status", "--json", env=env)
        assert result.returncode == 0, result.stderr
        section: dict[str, Any] = json.loads(result.stdout)["sections"]["workers"]
        return section

    pids = []
    for life in (1, 2):
        worker = Worker(env, Path(env[LOG_ENV]), 1, extra_args=["-n", name]).start()
        try:
            section = workers()
            assert section["state"] == "ok", section
            assert section["nodes"] == [node]
            info = section["workers"][node]
            assert info["pid"] == worker.pid
            assert info["starts"] == life and info["restarts"] == life - 1
            assert info["uptime_seconds"] is not None
            assert f"pid {worker.pid}" in section["detail"]
            if life == 2:
                assert "restarted 1 time" in section["detail"]
                text = run("-A", APP, "status", env=env)
                assert f"{node} (pid {worker.pid}, up " in text.stdout
            pids.append(worker.pid)
        finally:
            worker.kill_all()
    assert pids[0] != pids[1]

    gone = workers()
    assert gone["state"] == "warn"
    assert gone["nodes"] == []
    assert node in gone["silent"]
    assert node in gone["detail"]


def test_retired_workers_fade_from_status_and_old_starts_are_dropped(dex: Dex) -> None:
    """A node silent for more than a day is not listed; a start older than 30 days is dropped
    when another worker records its start (the hash does not grow with every container)."""
    now = dex.ledger.now()

    def fake_start(node: str, age: float) -> None:
        value = {"pid": 1, "started_at": now - age, "starts": 1}
        dex.redis.hset(dex.keys.worker_starts, node, json.dumps(value))

    fake_start("recent@h", 60.0)
    fake_start("retired@h", SILENT_WINDOW + 60.0)
    fake_start("ancient@h", FORGET_AFTER + 60.0)
    section = workers_section(dex)
    assert section.state.value == "warn"
    assert list(section.values["silent"]) == ["recent@h"]
    assert "recent@h (started 1m ago)" in section.detail

    record_start(dex, "fresh@h", pid=4242)
    assert set(read_starts(dex)) == {"recent@h", "retired@h", "fresh@h"}
    assert read_starts(dex)["fresh@h"].starts == 1
