"""The pytest plugin of `dex_celery.testing` (loaded by `pytest_plugins = ["dex_celery.testing"]`
in the user's conftest, or `pytest -p dex_celery.testing`; never loaded on its own).

When pytest starts, the plugin points every `DEX_*` connection setting of the test process at the
kit's own: a private redis-server on a free port (started by the `dex_redis` fixture), a
throwaway SQLite file (or a fresh schema in the PostgreSQL database named by the `dex_database_url`
ini option or `DEX_TESTING_DATABASE_URL`), and timings short enough for a fault to resolve in
seconds. So the user's `Dex`, imported by the `dex` fixture, and the worker and beat the kit
starts all meet there. Import the app through the `dex` fixture, not at the top of conftest.py:
a `Dex` reads its settings when it is created.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import redis

from dex_celery.app import Dex
from dex_celery.cli.appfinder import find_dex
from dex_celery.processes.localstack import free_port
from dex_celery.settings import env_name
from dex_celery.testing import leftovers
from dex_celery.testing.effects import EFFECTS_DIR_ENV
from dex_celery.testing.processes import RedisServer
from dex_celery.testing.stack import DexStack, StackConfig

DATABASE_URL_ENV = "DEX_TESTING_DATABASE_URL"
#: Short timings so a lost attempt is found, and a deadline passes, within seconds
#: (production defaults are measured in bench/). A variable already set wins.
TIMINGS = {
    "DEX_HEARTBEAT_TIMEOUT": "1.5",
    # Long enough for a worker started after the request to take it on a loaded machine.
    "DEX_SCHEDULE_TO_START": "15",
    "DEX_SWEEP_INTERVAL": "0.2",
    "DEX_UNRECORDED_GRACE": "1",
    "DEX_ORPHAN_GRACE": "1",
    "DEX_BACKOFF_INITIAL": "0.1",
    "DEX_BACKOFF_MAX": "0.5",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dex-celery", "dex_celery.testing: your tools under faults")
    group.addoption("--dex-app", default=None, help="the app under test, as for celery -A")
    parser.addini("dex_app", "the app under test, as for celery -A (module[:app or :dex])")
    parser.addini("dex_pool", "the worker's pool (celery -P)", default="prefork")
    parser.addini("dex_concurrency", "the worker's pool size (celery -c)", default="2")
    parser.addini("dex_beat", "start celery beat (the dex sweeper) too", type="bool", default=True)
    parser.addini("dex_database_url", "a PostgreSQL URL to test on (else SQLite)", default="")


class _Session:
    """The kit's settings for this pytest run, chosen once before any test module imports."""

    def __init__(self, config: pytest.Config) -> None:
        # What runs SIGKILLed before this one left behind (docs/testing.md).
        leftovers.sweep_stale()
        self.directory = Path(tempfile.mkdtemp(prefix=leftovers.FOLDER_PREFIX))
        leftovers.own(self.directory)
        self.redis_port = free_port()
        self.saved = dict(os.environ)
        postgres = str(config.getini("dex_database_url") or os.environ.get(DATABASE_URL_ENV, ""))
        self.schema = f"dex_kit_{uuid.uuid4().hex[:10]}" if postgres else None
        self.database_url = postgres or f"sqlite:///{self.directory / 'dex.db'}"

    def apply(self) -> None:
        os.environ[env_name("redis_url")] = f"redis://127.0.0.1:{self.redis_port}/0"
        os.environ[env_name("database_url")] = self.database_url
        if self.schema:
            os.environ[env_name("database_schema")] = self.schema
        else:
            os.environ.pop(env_name("database_schema"), None)
        os.environ.setdefault(env_name("secret_key"), f"dex-testing-{uuid.uuid4().hex}")
        for name, value in TIMINGS.items():
            os.environ.setdefault(name, value)

    def restore(self) -> None:
        os.environ.clear()
        os.environ.update(self.saved)
        leftovers.release()
        shutil.rmtree(self.directory, ignore_errors=True)


_SESSION_KEY = pytest.StashKey[_Session]()


_HANDLERS_KEY = pytest.StashKey[dict[signal.Signals, Any]]()

#: Signals that stop a run the way Ctrl-C does (a CI `timeout`, a cancelled job, a closed
#: terminal): every fixture's teardown runs, so nothing the kit started is left behind.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stop_like_ctrl_c(signum: int, frame: FrameType | None) -> None:
    # The teardown that follows must not be cut short by the same signal sent again (a
    # supervisor repeating it): further ones are ignored until the run ends.
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    session = _Session(config)
    session.apply()
    config.stash[_SESSION_KEY] = session
    handlers: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for stop in STOP_SIGNALS:
            if signal.getsignal(stop) in (signal.SIG_DFL, None):  # never replace a user's own
                handlers[stop] = signal.signal(stop, _stop_like_ctrl_c)
    config.stash[_HANDLERS_KEY] = handlers


def pytest_unconfigure(config: pytest.Config) -> None:
    for stop, previous in config.stash.get(_HANDLERS_KEY, {}).items():
        signal.signal(stop, previous)
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None:
        session.restore()


def _session(config: pytest.Config) -> _Session:
    return config.stash[_SESSION_KEY]


@pytest.fixture(scope="session")
def dex_app_path(pytestconfig: pytest.Config) -> str:
    """The app under test, as for `celery -A` (`--dex-app`, or the `dex_app` ini option);
    override this fixture to choose it in code."""
    path = pytestconfig.getoption("--dex-app") or pytestconfig.getini("dex_app")
    if not path:
        raise pytest.UsageError(
            "dex_celery.testing: name your app with `dex_app = shop.celery` in the [pytest] "
            "ini section, `--dex-app shop.celery`, or a `dex_app_path` fixture"
        )
    return str(path)


@pytest.fixture(scope="session")
def dex_redis(pytestconfig: pytest.Config) -> Iterator[RedisServer]:
    """The kit's private redis-server (broker and ledger), on the port chosen at start-up."""
    session = _session(pytestconfig)
    server = RedisServer(session.directory / "redis", port=session.redis_port).start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def dex_database(pytestconfig: pytest.Config) -> Iterator[str]:
    """The throwaway database, at the newest schema (the Alembic migrations, as production);
    a PostgreSQL schema of its own is dropped at the end."""
    from dex_celery.store.migrate import upgrade  # deferred: Alembic is slow to import

    session = _session(pytestconfig)
    upgrade(session.database_url, schema=session.schema)
    yield session.database_url
    if session.schema:
        import sqlalchemy  # deferred: only for a PostgreSQL run

        engine = sqlalchemy.create_engine(session.database_url)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f'DROP SCHEMA IF EXISTS "{session.schema}" CASCADE'))
        engine.dispose()


@pytest.fixture(scope="session")
def dex(dex_app_path: str, dex_redis: RedisServer, dex_database: str) -> Dex:
    """The user's `Dex`, imported in the test process with the kit's Redis and database."""
    root = str(Path.cwd())
    if root not in sys.path:
        sys.path.insert(0, root)
    return find_dex(dex_app_path)


@pytest.fixture
def dex_stack(
    dex: Dex,
    dex_app_path: str,
    dex_redis: RedisServer,
    pytestconfig: pytest.Config,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[DexStack]:
    """A clean Redis, the side-effect counter, and beat (unless `dex_beat = false`); start the
    worker with `dex_stack.start_worker(...)` (or use `dex_worker`). Everything the stack
    started is killed at the end of the test."""
    if dex_redis.process is None or dex_redis.process.poll() is not None:
        dex_redis.start()  # a test that killed it, or failed while it was down
    redis.Redis.from_url(dex_redis.url).flushall()
    directory = tmp_path / "dex-stack"
    effects = directory / "effects"
    effects.mkdir(parents=True)
    monkeypatch.setenv(EFFECTS_DIR_ENV, str(effects))
    root = Path.cwd()
    env = {
        **os.environ,
        EFFECTS_DIR_ENV: str(effects),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    config = StackConfig(
        app=dex_app_path,
        pool=str(pytestconfig.getini("dex_pool")),
        concurrency=int(pytestconfig.getini("dex_concurrency")),
        beat=bool(pytestconfig.getini("dex_beat")),
        cwd=root,
    )
    stack = DexStack(dex, config, dex_redis, env, directory)
    try:
        if config.beat:
            stack.start_beat()
        yield stack
    finally:
        stack.close()


@pytest.fixture
def dex_worker(dex_stack: DexStack) -> DexStack:
    """`dex_stack` with a worker of the app running (no pause point)."""
    dex_stack.start_worker()
    return dex_stack
