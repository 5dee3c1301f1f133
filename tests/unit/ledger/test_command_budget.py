"""The Redis commands a successful call costs in the ledger (docs/benchmarks.md).

Every command a script runs is work Redis does for every call, so the budget is pinned here: a
change that reads a call hash field by field again, or reads the frozen-time key on its own,
fails this test rather than showing up weeks later as a slower benchmark. Counted on a private
real redis-server with `INFO commandstats`, which counts the commands inside scripts too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devtools.processes import RedisServer
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Cause, Ledger
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.settings import Settings

EPOCH = "e1"
#: A read with the default policy, resolved as a tool registration resolves it.
SNAPSHOT = resolve_policy(ToolPolicy(effect=EffectClass.READ), None, None, Settings())


@pytest.fixture
def client(tmp_path: Path) -> Iterator[redis.Redis]:
    server = RedisServer(tmp_path / "redis").start()
    c = redis.Redis.from_url(server.url, decode_responses=True)
    yield c
    c.close()
    server.kill()


def counts(client: redis.Redis) -> dict[str, int]:
    info = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}


def successful_call(ledger: Ledger, key: str) -> None:
    ledger.open(key, SNAPSHOT, epoch=EPOCH)
    assert ledger.claim(key, 1, owner="w1", fence="f1").ok
    step = ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload="{}")
    assert step.status == "succeeded"
    assert ledger.recorded(key, status="succeeded", error="")


def test_a_successful_call_costs_at_most_30_redis_commands(client: redis.Redis) -> None:
    ledger = Ledger(client, keys=KeySpace("budget"))
    ledger.rotate(expected_dataset="", dataset="d", epoch=EPOCH)
    successful_call(ledger, "s/t/warm")  # loads the scripts
    before = counts(client)
    successful_call(ledger, "s/t/c1")
    after = counts(client)
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    delta.pop("info", None)
    assert delta.pop("evalsha") == 4  # open, claim, finish, recorded: one round trip each
    # Each script reads the call hash at most once and writes it at most once, reads the epoch
    # and the frozen time in one MGET, and asks TIME only because no frozen time is set.
    assert delta.get("hmget", 0) == 2  # claim, finish
    # recorded: the call's write budgets (S13.1), one field, to settle them by the recorded
    # status in the same step; a call without budgets costs nothing more.
    assert delta.get("hget", 0) == 1
    assert delta.get("get", 0) == 0
    assert delta.get("hset", 0) == 3  # open, claim, finish
    assert delta.get("mget", 0) == 3  # open, claim, finish
    assert delta.get("time", 0) == 3
    # requested (open), started (claim), ended (finish: a waiting caller learns the outcome
    # before SQL has it), finished (recorded: the record is in SQL).
    assert delta.get("xadd", 0) == 4
    assert sum(delta.values()) + 4 <= 30, delta


def test_a_frozen_time_replaces_time_in_the_same_read(client: redis.Redis) -> None:
    """The unit tests' frozen clock costs no extra command and is what the scripts use."""
    keys = KeySpace("frozen")
    ledger = Ledger(client, keys=keys, clock_refresh=0.0)
    ledger.rotate(expected_dataset="", dataset="d", epoch=EPOCH)
    client.set(keys.clock, "1000.5")
    before = counts(client)
    successful_call(ledger, "s/t/c1")
    after = counts(client)
    assert after.get("time", 0) == before.get("time", 0)
    assert float(client.hget(keys.call("s/t/c1"), "finished_at") or 0) == 1000.5
