"""Fixtures: a private redis-server per test session, a fresh database and ledger per test,
real Celery prefork workers, and a sweeper running in the test process."""

from __future__ import annotations

import os
import signal
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from devtools import forkserver
from devtools.processes import RedisServer, Worker
from devtools.redis_cluster import RedisClusterNodes
from devtools.toolapp import LOG_ENV, UNSERVED_QUEUE
from dex_celery import Dex
from dex_celery.engine.upkeep.sweep import run_forever
from tests.support.faults.rabbitmq import (
    RABBITMQ,
    REDIS,
    amqp_url,
    delete_queues,
    shared_server_missing,
    test_vhost,
)
from tests.support.processes.workers import each_stopped
from tests.support.runs.failures_now import register as register_failures_now
from tests.support.runs.phase_times import register as register_phase_times
from tests.support.runs.signal_masks import signal_masks
from tests.support.stores.databases import SQLITE, database_url
from tests.support.stores.env_dex import dex_of

#: The fuzz tests' budget (tests/integration/bad_input/test_fuzz_*.py, `FUZZ_PROFILE`): a fixed
#: number of examples and no per-example deadline (a loaded 2-core machine is slow, not wrong),
#: so the fuzz run is bounded in CI; `DEX_HYPOTHESIS_PROFILE=fuzz-long` searches longer locally.
FUZZ_PROFILE = "fuzz"
hypothesis_settings.register_profile(
    FUZZ_PROFILE,
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
hypothesis_settings.register_profile(
    "fuzz-long", hypothesis_settings.get_profile(FUZZ_PROFILE), max_examples=2000
)

# Tight settings so crash tests finish in seconds; the defaults are measured in bench/.
TEST_TIMINGS = {
    "DEX_HEARTBEAT_TIMEOUT": "1.5",
    "DEX_SCHEDULE_TO_START": "5",
    "DEX_SWEEP_INTERVAL": "0.2",
    "DEX_UNRECORDED_GRACE": "1",
    "DEX_ORPHAN_GRACE": "1",
    "DEX_BACKOFF_INITIAL": "0.1",
    "DEX_BACKOFF_MAX": "0.5",
}


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def rabbitmq_vhost() -> Iterator[str]:
    """A vhost of this test run on the machine's RabbitMQ (deleted at the end), or a skip that
    says what is missing."""
    missing = shared_server_missing()
    if missing:
        pytest.skip(f"RabbitMQ broker runs skipped: {missing}")
    with test_vhost() as name:
        yield name


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """A real local Redis Cluster: three primaries, each with one replica (docs/redis.md)."""
    cluster = RedisClusterNodes(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.kill()


@pytest.fixture
def broker_kind(request: pytest.FixtureRequest) -> str:
    """The broker of the test's deployment: the ledger's Redis unless a test is parametrized
    with `tests.support.faults.rabbitmq.ON_BOTH_BROKERS` (docs/rabbitmq.md)."""
    return str(getattr(request, "param", REDIS))


@pytest.fixture
def database_kind(request: pytest.FixtureRequest) -> str:
    """The SQL database of the test's deployment: SQLite unless a test is parametrized with
    `tests.support.stores.databases.ON_BOTH_DATABASES`."""
    return str(getattr(request, "param", SQLITE))


#: The SQL engines the current test connected through (the test process's own: its `Dex`
#: apps' stores, the tests' direct engines).
_engines_used: weakref.WeakSet[Engine] = weakref.WeakSet()


@event.listens_for(Engine, "engine_connect")
def _note_engine(connection: Connection) -> None:
    _engines_used.add(connection.engine)


@pytest.fixture(autouse=True)
def _close_sql_pools() -> Iterator[None]:
    """Close the pooled connections a test left behind. A test's `Dex` (and its store's pool)
    outlives the test while Celery keeps its app, so without this each test process kept one
    or more idle PostgreSQL connections per test, and `-n 3` processes ran the shared server
    out of connections ("too many clients already"). Autouse, so torn down after the test's
    own fixtures."""
    yield
    for engine in list(_engines_used):
        engine.dispose()
    _engines_used.clear()


@pytest.fixture(autouse=True)
def _signals_as_found() -> Iterator[None]:
    """A test leaves the test process's signals as it found them (SIGINT's handler, the main
    thread's blocked and ignored masks): the processes later tests start inherit them, and a
    run that inherited SIGINT ignored or blocked never sees a Ctrl-C
    (tests/integration/testing/test_cut_runs.py)."""
    before = signal.getsignal(signal.SIGINT), signal_masks(os.getpid(), ("SigBlk", "SigIgn"))
    yield
    after = signal.getsignal(signal.SIGINT), signal_masks(os.getpid(), ("SigBlk", "SigIgn"))
    assert after == before, f"the test changed this process's signals: {before} -> {after}"


@pytest.fixture
def env(
    redis_server: RedisServer,
    tmp_path: Path,
    broker_kind: str,
    database_kind: str,
    request: pytest.FixtureRequest,
) -> Iterator[dict[str, str]]:
    """Environment shared by the test process and the workers it starts."""
    redis.Redis.from_url(redis_server.url).flushall()
    tool_log = tmp_path / "tool-log"
    tool_log.mkdir()
    broker_env = {}
    if broker_kind == RABBITMQ:
        url = amqp_url(request.getfixturevalue("rabbitmq_vhost"))
        delete_queues(url, ("celery", UNSERVED_QUEUE))  # what an earlier test left queued
        broker_env["DEX_BROKER_URL"] = url
    with database_url(database_kind, tmp_path) as database:
        yield {
            **broker_env,
            "DEX_REDIS_URL": redis_server.url,
            "DEX_DATABASE_URL": database,
            "DEX_KEY_PREFIX": f"t{uuid.uuid4().hex[:8]}",
            LOG_ENV: str(tool_log),
            # Seals secret arguments at rest and in the broker (docs/secrets.md).
            "DEX_SECRET_KEY": f"test-key-{uuid.uuid4().hex}",
            **TEST_TIMINGS,
        }


@pytest.fixture
def dex(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dex:
    return dex_of(env, monkeypatch)


@pytest.fixture
def start_worker(env: dict[str, str]) -> Iterator[Callable[..., Worker]]:
    def start(
        *, concurrency: int = 2, extra_env: dict[str, str] | None = None, pool: str = "prefork"
    ) -> Worker:
        return Worker(
            {**env, **(extra_env or {})}, Path(env[LOG_ENV]), concurrency, pool=pool
        ).start()

    yield from each_stopped(start)


@pytest.fixture
def sweeper(dex: Dex) -> Iterator[threading.Event]:
    """The sweeper loop of `dex-celery sweep --loop`, in a thread of the test process."""
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(dex,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    yield stop
    stop.set()
    thread.join(timeout=10)


def pytest_configure(config: pytest.Config) -> None:
    register_failures_now(config)  # a cut run still names its failures (docs/testing.md)
    register_phase_times(config)  # DEX_TEST_TIMES: each test's seconds as it ends
    # Workers and `dex-celery` runs fork from a server that imported the stack once
    # (devtools/forkserver.py; docs/testing.md, "Where the time goes"); DEX_TEST_FORKSERVER=0
    # starts each as a new interpreter instead.
    os.environ.setdefault(forkserver.ENABLE_ENV, "1")
    os.environ.setdefault(
        "DEX_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    )


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadfile`: a file per unit (a long test's cases spread), the longest first
    (tests/support/runs/xdist_units.py); optional: a run without pytest-xdist loads this file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.support.runs.xdist_units import LongestFilesFirst  # pytest-xdist, only when it runs

    return LongestFilesFirst(config, log)  # type: ignore[arg-type]
