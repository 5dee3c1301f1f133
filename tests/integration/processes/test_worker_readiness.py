"""A worker is not ready until its database and Redis answer; its probes test what they claim.

docs/operations.md, "Probes": a worker whose database URL is wrong, whose schema is missing or
older than its code, or whose Redis ledger does not answer refuses before Celery's `ready.` with
one typed error line and exit status 1 (it used to log a warning and say `ready.`, and
`celery inspect ping` passed). Its health door answers `/readyz` (SQL, Redis and the broker
answer now) and `/livez` (its main loop ticks), checked for `Host` like every door; `dex-celery
probe` asks the same from an exec probe, and `probe live --beat` fails once beat stops sweeping.
"""

from __future__ import annotations

import http.client
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from devtools.processes import CeleryBeat, Worker, free_port, wait_for
from devtools.toolapp import LOG_ENV
from dex_celery.store.migrate import upgrade
from tests.support.processes.cli_run import APP, dead_redis, one_error_line, run

#: An older revision of the schema than the code's (docs/deploy.md, "Online schema upgrades").
OLD_REVISION = "0008"


def _refused(env: dict[str, str]) -> str:
    """Start a worker that must refuse; the one log line that says why."""
    worker = Worker(env, Path(env[LOG_ENV]), 1)
    try:
        with pytest.raises(RuntimeError, match="worker exited at start"):
            worker.start(timeout=60)
        assert worker.process is not None and worker.process.returncode == 1
        log = worker.log()
    finally:
        worker.stop()
    assert " ready." not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "does not start" in line]
    assert len(lines) == 1, log[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("database unreachable", "DatabaseUnavailable"),
        ("no schema", "SchemaMissing"),
        ("schema older than the code", "SchemaOutdated"),
        ("redis unreachable", "RedisUnavailable"),
    ],
)
def test_a_misconfigured_worker_refuses_before_ready(
    env: dict[str, str], case: str, error: str
) -> None:
    env = {**env, "DEX_STARTUP_WAIT": "2"}  # a service that does not answer is asked again
    if case == "database unreachable":
        env["DEX_DATABASE_URL"] = f"postgresql+psycopg://dex@127.0.0.1:{free_port()}/dex"
    elif case == "schema older than the code":
        upgrade(env["DEX_DATABASE_URL"], OLD_REVISION)
    elif case == "redis unreachable":
        upgrade(env["DEX_DATABASE_URL"])
        env["DEX_REDIS_URL"] = dead_redis()
    line = _refused(env)
    assert f"worker does not start: {error}: " in line, line
    if error.startswith("Schema"):
        assert "dex-celery db upgrade" in line, line


def _get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def test_the_health_door_answers_what_it_claims(
    env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    upgrade(env["DEX_DATABASE_URL"])
    port = free_port()
    door = {"DEX_WORKER_METRICS_PORT": str(port)}
    worker = start_worker(concurrency=1, extra_env=door)
    probe_env = {**env, **door}

    assert _get(port, "/readyz") == (200, "ready (database, redis, broker)\n")
    status, body = _get(port, "/livez")
    assert status == 200 and body.startswith("ok: the main loop ticked"), body
    assert _get(port, "/livez", host="rebound.example")[0] == 421  # the Host check comes first
    for args in (["ready"], ["ready", "--worker"], ["live"]):
        result = run("-A", APP, "probe", *args, env=probe_env)
        assert result.returncode == 0, (args, result.stdout, result.stderr)

    # The database goes away: not ready, still alive (no restart of a worker running tools).
    database = make_url(env["DEX_DATABASE_URL"]).database
    assert database is not None
    os.remove(database)
    assert _get(port, "/readyz") == (503, "not ready: database (SchemaMissing)\n")
    assert _get(port, "/livez")[0] == 200
    line = one_error_line(run("-A", APP, "probe", "ready", "--worker", env=probe_env))
    assert "503" in line and "SchemaMissing" in line, line

    # The main process stops: liveness fails.
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        line = one_error_line(run("-A", APP, "probe", "live", env=probe_env))
        assert "did not answer /livez" in line, line
    finally:
        os.kill(worker.pid, signal.SIGCONT)


def test_beat_is_alive_while_its_sweeper_sweeps(env: dict[str, str], tmp_path: Path) -> None:
    upgrade(env["DEX_DATABASE_URL"])
    before = one_error_line(run("-A", APP, "probe", "live", "--beat", env=env))
    assert "no sweep has ended yet" in before, before

    beat = CeleryBeat(APP, env, tmp_path / "beat").start()
    try:
        wait_for(
            lambda: run("-A", APP, "probe", "live", "--beat", env=env).returncode == 0,
            timeout=30,
            what="beat's liveness probe to pass",
        )
    finally:
        beat.stop()
    wait_for(
        lambda: run("-A", APP, "probe", "live", "--beat", env=env).returncode == 1,
        timeout=30,
        what="beat's liveness probe to fail once beat stopped",
    )
    line = one_error_line(run("-A", APP, "probe", "live", "--beat", env=env))
    assert "the sweeper stopped" in line, line
