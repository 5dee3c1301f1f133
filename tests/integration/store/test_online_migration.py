"""An online schema upgrade: the previous release keeps working against the newest schema
(docs/deploy.md, "Online schema upgrades"; the rule: `dex_celery/store/migrations/__init__.py`).

The previous release (`tests.support.stores.releases.PREVIOUS_RELEASE`) is taken from this
repository's git history into a folder of its own. On a fresh PostgreSQL database the old code
migrates to its own head and a real prefork worker of the old code starts; then the new code's
`dex-celery db upgrade` runs to the newest revision while that worker runs, as a deploy's first
step does. The old worker then serves a read and a non-idempotent write requested by the new
code and by the old code; and a worker of the new code serves the old requester's calls (the
rolling restart's other half). Each write runs once by the tool's own log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devtools.processes import ROOT, CeleryWorker, RedisServer
from devtools.toolapp import LOG_ENV, executions
from dex_celery.store import migrate
from tests.conftest import TEST_TIMINGS
from tests.support.stores.pg_database import fresh_database
from tests.support.stores.releases import materialise

pytestmark = pytest.mark.postgres

#: One requester run: a read and a non-idempotent write, each to its end; prints, per call, its
#: key, status and result, and first the file its `dex_celery` came from.
REQUESTER = textwrap.dedent(
    """
    import json, sys
    import dex_celery
    from devtools.toolapp import dex

    print(dex_celery.__file__)
    client = dex.client()
    session = sys.argv[1]
    read = client.request_call(session, "t1", "c1", "echo", {"asked_by": session})
    write = client.request_call(session, "t1", "c2", "slow_non_idempotent_write", {"seconds": 0})
    for record in client.wait([read.key, write.key], timeout=60):
        print(json.dumps([record.key, record.status.value, record.result]))
    """
)


@pytest.fixture
def old_code(tmp_path: Path) -> Path:
    return materialise(tmp_path / "previous-release")


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database("dex_online_migration") as url:
        yield url


@pytest.fixture
def deploy_env(redis_server: RedisServer, database: str, tmp_path: Path) -> dict[str, str]:
    redis.Redis.from_url(redis_server.url).flushall()
    tool_log = tmp_path / "tool-log"
    tool_log.mkdir()
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("DEX_")}
    inherited.pop("PYTHONPATH", None)
    return {
        **inherited,
        **TEST_TIMINGS,
        "DEX_REDIS_URL": redis_server.url,
        "DEX_DATABASE_URL": database,
        "DEX_KEY_PREFIX": f"t{uuid.uuid4().hex[:8]}",
        "DEX_SECRET_KEY": f"test-key-{uuid.uuid4().hex}",
        LOG_ENV: str(tool_log),
        "PYTHONUNBUFFERED": "1",
    }


def _code_env(env: dict[str, str], code: Path) -> dict[str, str]:
    """`env` for a process of the code in `code` (the old release's folder, or ROOT)."""
    return {**env, "PYTHONPATH": str(code)} if code != ROOT else env


def _run(code: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`python <args>` of the code in `code`: started there, with it first on the path."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=code,
        env=_code_env(env, code),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _old_db_upgrade(old: Path, env: dict[str, str]) -> str:
    done = _run(old, env, "-c", "from dex_celery.cli.main import main; main()", "db", "upgrade")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _request(code: Path, env: dict[str, str], session: str) -> dict[str, tuple[str, str]]:
    """Run `REQUESTER` with the code in `code`; {key: (status, result)} of its two calls."""
    done = _run(code, env, "-c", REQUESTER, session)
    assert done.returncode == 0, done.stderr[-3000:]
    origin, *lines = done.stdout.splitlines()
    assert Path(origin).is_relative_to(code / "dex_celery"), (origin, code)
    return {key: (status, result) for key, status, result in map(json.loads, lines)}


def _worker(code: Path, env: dict[str, str]) -> CeleryWorker:
    return CeleryWorker(
        "devtools.toolapp", _code_env(env, code), Path(env[LOG_ENV]), concurrency=2, cwd=code
    ).start()


def _served(calls: dict[str, tuple[str, str]], session: str) -> None:
    """Both calls succeeded; the read saw its arguments; the write ran exactly once."""
    read, write = f"{session}/t1/c1", f"{session}/t1/c2"
    assert calls[read][0] == "succeeded", calls
    assert json.loads(calls[read][1])["arguments"] == {"asked_by": session}
    assert calls[write] == ("succeeded", json.dumps("done")), calls
    assert [line.split()[0] for line in executions(write)] == ["start", "end"]


def test_the_previous_release_runs_against_the_newest_schema(
    old_code: Path, deploy_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = deploy_env
    monkeypatch.setenv(LOG_ENV, env[LOG_ENV])  # `executions` reads the tools' own log here
    url = env["DEX_DATABASE_URL"]
    old_head = _old_db_upgrade(old_code, env).strip().rsplit(" ", 1)[-1]
    assert migrate.current(url) == old_head

    old_worker = _worker(old_code, env)
    try:
        _served(_request(old_code, env, "before"), "before")
        # The deploy's first step, while the old worker runs (and has calls on record).
        upgraded = subprocess.run(
            [str(Path(sys.executable).parent / "dex-celery"), "db", "upgrade"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert upgraded.returncode == 0, upgraded.stderr[-3000:]
        assert migrate.current(url) == migrate.head()
        assert not old_worker.died(), old_worker.log()[-3000:]
        # The old worker serves the new requester's calls and the old requester's.
        _served(_request(ROOT, env, "new-asks-old"), "new-asks-old")
        _served(_request(old_code, env, "old-asks-old"), "old-asks-old")
    finally:
        old_worker.stop(warm=True)
    # The other half of a rolling restart: new workers, requesters not upgraded yet.
    new_worker = _worker(ROOT, env)
    try:
        _served(_request(old_code, env, "old-asks-new"), "old-asks-new")
    finally:
        new_worker.stop(warm=True)
    assert "Traceback" not in old_worker.log() + new_worker.log()
