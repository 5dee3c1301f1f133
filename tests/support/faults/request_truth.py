"""A Dex on a Redis of the test's own that can be filled until it refuses writes, and a sweeper loop beside it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from devtools.processes import RedisServer
from devtools.toolapp import make_app
from dex_celery import (
    Dex,
    Settings,
)
from dex_celery.engine.upkeep.sweep import run_forever


@contextmanager
def small_redis(directory: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own with 8 MB of memory and no eviction, so filling it makes
    it refuse writes (`fill_until_out_of_memory`); killed on exit."""
    server = RedisServer(
        directory / "oom-redis",
        extra_args=("--maxmemory", "8mb", "--maxmemory-policy", "noeviction"),
    ).start()
    try:
        yield server
    finally:
        server.kill()


@contextmanager
def sweeping(dex: Dex) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(dex,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def dex_on(env: dict[str, str], server: RedisServer) -> tuple[Dex, dict[str, str]]:
    """A Dex (schema made by the `dex` fixture) whose ledger and broker are `server`; the
    ledger is bound and its epoch read while Redis still answers."""
    own_env = {**env, "DEX_REDIS_URL": server.url}
    _app, own = make_app(Settings.from_env(own_env))
    own.epoch()
    return own, own_env


def fill_until_out_of_memory(server: RedisServer) -> list[str]:
    """Write filler keys until Redis refuses writes (`command not allowed when used memory >
    'maxmemory'`), then keep it there: a connection closing frees a few kilobytes, which would
    let the next write through, so `maxmemory` is lowered well below what the fillers use."""
    client = redis.Redis.from_url(server.url)
    keys: list[str] = []
    for _ in range(100_000):
        name = f"filler:{len(keys)}"
        try:
            client.set(name, b"x" * 65536)
        except redis.ResponseError as e:
            assert "maxmemory" in str(e), e
            break
        keys.append(name)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(used * 3 // 4))
    with pytest.raises(redis.ResponseError, match="maxmemory"):
        client.set("probe", b"x")
    return keys
