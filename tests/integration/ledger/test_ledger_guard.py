"""The ledger guard on real redis-servers (docs/ledger.md, "Rollback" and "One database, one
ledger"; S10.2, S10.3): what starts a new ledger life, what does not, and what a dispatcher
acting on an old read of a record may still open."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devtools.processes import RedisServer
from devtools.toolapp import make_app
from dex_celery import CallStatus, Dex, Settings
from dex_celery.store.values import Outcome


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", appendonly=True, appendfsync="always").start()
    yield server
    server.kill()


@pytest.fixture
def guarded(env: dict[str, str], own_redis: RedisServer, tmp_path: Path) -> Dex:
    settings = Settings.from_env(
        {**env, "DEX_REDIS_URL": own_redis.url, "DEX_DATABASE_URL": f"sqlite:///{tmp_path}/g.db"}
    )
    _app, dex = make_app(settings)
    dex.store.create_schema()
    return dex


def test_the_same_server_keeps_its_epoch(guarded: Dex) -> None:
    first = guarded.epoch(refresh=True)
    assert guarded.epoch(refresh=True) == first


def test_any_restart_starts_a_new_life_even_one_that_lost_nothing(
    guarded: Dex, own_redis: RedisServer
) -> None:
    """An append-only file fsynced on every write loses nothing, but from inside Redis a
    restart cannot be told from a restored backup: the guard treats both alike."""
    first = guarded.epoch(refresh=True)
    own_redis.restart()
    assert guarded.ledger.client.get(guarded.keys.epoch) == first  # the data came back...
    assert guarded.epoch(refresh=True) != first  # ...and the ledger starts a new life anyway


def test_evicted_keys_start_a_new_life(guarded: Dex) -> None:
    """An evicting maxmemory-policy may have dropped ledger keys: same server, new life."""
    first = guarded.epoch(refresh=True)
    client = guarded.ledger.client
    client.config_set("maxmemory-policy", "allkeys-random")
    client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + 1_000_000))
    for i in range(400):
        client.set(f"junk:{i}", "x" * 10_000)
    assert int(client.info("stats")["evicted_keys"]) > 0
    client.config_set("maxmemory", "0")
    assert guarded.epoch(refresh=True) != first


def test_a_start_on_an_old_read_opens_only_what_is_still_in_flight(guarded: Dex) -> None:
    """A requester or sweeper that read a record before it ended (or before its write was
    claimed) must not open it again (docs/ledger.md, windows that remain)."""
    client = guarded.client()
    ended = client.request_call("s1", "t1", "c1", "unserved_write", {})
    claimed = client.request_call("s1", "t1", "c2", "unserved_write", {})
    for record in (ended, claimed):  # forget what the requests opened
        guarded.ledger.client.delete(guarded.keys.call(record.key))
    guarded.store.record_outcome(ended.key, Outcome(CallStatus.SUCCEEDED, "", result="1"))
    assert guarded.store.claim_write(
        claimed.key, 1, fence=uuid.uuid4().hex, owner="w:1", now=guarded.ledger.now()
    )
    broker = redis.Redis.from_url(guarded.settings.effective_broker_url)
    queued_before = sum(broker.llen(q) for q in broker.keys("*") if broker.type(q) == b"list")
    for record in (ended, claimed):  # the records as read before they ended / were claimed
        guarded.runtime.opener.start(record)
        assert guarded.ledger.read(record.key) is None
    queued_after = sum(broker.llen(q) for q in broker.keys("*") if broker.type(q) == b"list")
    assert queued_after == queued_before
    assert json.loads(guarded.store.get_call(ended.key).result or "null") == 1  # type: ignore[union-attr]
