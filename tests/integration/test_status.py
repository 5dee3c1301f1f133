"""`dex-celery status` and the worker's warnings about a broken deployment.

A deployment that never migrated its database, or whose beat does not run the sweeper, looks
healthy from Celery's side while calls stay `pending` for ever: the worker says so in its log,
and `status` shows it with everything else an operator checks first.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from dex_celery import Dex
from dex_celery.store import migrate
from tests.integration.test_cli_like_celery import APP, dead_redis, one_error_line, run
from tests.support.processes import Worker, wait_for


def test_a_worker_warns_without_schema_and_without_sweeper(
    env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """No `dex-celery db upgrade`, no beat: both are named in the worker's log."""
    worker = start_worker(concurrency=1)
    wait_for(
        lambda: "the database is not ready" in worker.log(), timeout=30, what="a schema warning"
    )
    assert "dex-celery db upgrade" in worker.log()
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
    assert list(sections) == ["redis", "database", "workers", "last_sweep", "calls", "webhooks"]
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
