"""Fixtures of the crash tests that take Redis away: a redis-server of the test's own, with RDB
snapshots only (no append-only file, the stock configuration), and a Dex on it with a sweeper
loop running (the session's shared redis-server is never restarted)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.processes import RedisServer
from devtools.toolapp import make_app
from dex_celery import Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "own-redis", appendonly=False).start()
    yield server
    server.kill()


@pytest.fixture
def own_dex(dex: Dex, env: dict[str, str], own_redis: RedisServer) -> Iterator[Dex]:
    """A Dex on the test's own Redis (schema made by `dex`), with a sweeper loop running."""
    _app, own = make_app(Settings.from_env({**env, "DEX_REDIS_URL": own_redis.url}))
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(own,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    yield own
    stop.set()
    thread.join(timeout=15)
