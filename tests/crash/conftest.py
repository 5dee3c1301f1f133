"""Fixtures of the crash tests that take Redis away: a redis-server of the test's own, with RDB
snapshots only (no append-only file, the stock configuration), and a Dex on it with a sweeper
loop running (the session's shared redis-server is never restarted)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.processes import RedisServer
from dex_celery import Dex
from tests.support.faults.crash import dex_with_sweeper


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "own-redis", appendonly=False).start()
    yield server
    server.kill()


@pytest.fixture
def own_dex(dex: Dex, env: dict[str, str], own_redis: RedisServer) -> Iterator[Dex]:
    """A Dex on the test's own Redis (schema made by `dex`), with a sweeper loop running."""
    yield from dex_with_sweeper({**env, "DEX_REDIS_URL": own_redis.url})
