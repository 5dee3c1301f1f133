"""One database, one ledger (docs/ledger.md; S10.3).

A second deployment with its own Redis, pointed by mistake at the first deployment's database
(as `dex-celery dev` started against the production `DEX_DATABASE_URL` would be), must refuse to
sweep or dispatch, saying which ledger the database belongs to, and the first deployment's
calls must end as they would have.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import ROOT, RedisServer, Worker
from devtools.toolapp import make_app
from dex_celery import CallStatus, Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever
from dex_celery.errors import LedgerMismatch
from tests.support.faults.crash import lines, release_tools, wait_finished, wait_started

pytestmark = pytest.mark.crash


@pytest.fixture
def other_redis(tmp_path: Path) -> Iterator[RedisServer]:
    # Durable, so the CLI's start-up check has nothing to warn about: its one line is the refusal.
    server = RedisServer(tmp_path / "redis-other", appendonly=True, appendfsync="always").start()
    yield server
    server.kill()


def test_a_second_deployment_on_the_same_database_refuses_and_changes_nothing(
    dex: Dex,
    env: dict[str, str],
    other_redis: RedisServer,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    start_worker(concurrency=2)
    client = dex.client()
    write = client.request_call("s1", "t1", "c1", "slow_non_idempotent_write", {"seconds": 60})
    read = client.request_call("s1", "t1", "c2", "slow_read", {"seconds": 60})
    wait_started(write.key)
    wait_started(read.key)

    second_env = {**env, "DEX_REDIS_URL": other_redis.url}
    _app, second = make_app(Settings.from_env(second_env))
    with pytest.raises(LedgerMismatch) as refused:
        second.sweeper.sweep_once()
    message = str(refused.value)
    assert other_redis.url.split("//")[1].split("/")[0] in message  # names this Redis
    assert "this database belongs to the ledger at" in message  # and the bound one
    with pytest.raises(LedgerMismatch):
        second.client().request_call("s2", "t1", "c1", "slow_read", {"seconds": 0})

    # The second deployment's sweeper loop keeps refusing while it runs; its CLI says so in
    # one line and exits 1.
    stop = threading.Event()
    loop = threading.Thread(target=run_forever, args=(second.sweeper,), kwargs={"stop": stop})
    loop.start()
    cli = subprocess.run(
        [
            str(Path(sys.executable).parent / "dex-celery"),
            "--app",
            "devtools.toolapp:dex",
            "sweep",
        ],
        cwd=ROOT,
        env={**os.environ, **second_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 1, cli
    assert cli.stderr.strip().startswith("error:"), cli.stderr
    assert "Traceback" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr

    release_tools(env)
    for record in (write, read):
        done = wait_finished(dex, record.key, timeout=30)
        assert done.status is CallStatus.SUCCEEDED, done
        assert len(lines(record.key, "start")) == 1
    stop.set()
    loop.join(timeout=15)
    # Nothing of the first deployment's was touched by the second one.
    assert client.get_agent_snapshot("s1").tool_calls
    with pytest.raises(LookupError):
        client.get_agent_snapshot("s2")
