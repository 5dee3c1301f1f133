"""The ledger scripts' test rig: one ledger on fakeredis, on a redis-server and on a Redis Cluster, with a clock the test moves, and the steps most tests take (open, claim, finish)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

import fakeredis
import pytest
import redis

from devtools.processes import RedisServer
from devtools.redis_cluster import RedisClusterNodes
from dex_celery.ledger.connection import redis_client
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import (
    Ledger,
    OpenResult,
    Step,
    StepKind,
    join_epochs,
)
from dex_celery.model.policy import EffectClass, EffectSource, PolicySnapshot

EPOCH = "epoch-1"


T0 = 1_000_000.0


HB = 5.0


S2S = 10.0


S2C = 100.0


B0 = 1.0


BMAX = 3.0


FINISHED_TTL = 600


@dataclass
class Knobs:
    """The clock and the jitter the scripts see; tests move them by hand.

    The scripts read Redis's clock; the ledger's frozen-time key (`KeySpace.clock`) holds it
    still, so every host, here the test, sees the same time.
    """

    now: float = T0
    jitter: float = 0.5
    freeze: Callable[[float], object] = lambda _t: None

    def advance(self, seconds: float) -> float:
        self.now += seconds
        self.freeze(self.now)
        return self.now


@dataclass
class Rig:
    ledger: Ledger
    client: redis.Redis
    keys: KeySpace
    knobs: Knobs
    #: The epoch this process passes (every shard's, joined, on a sharded ledger).
    epoch: str = EPOCH

    def hash(self, key: str) -> dict[str, str]:
        return cast(dict[str, str], self.client.hgetall(self.keys.call(key)))

    def score(self, index: str, key: str) -> float | None:
        """`index` named as shard 0's (`keys.queue_index`, ...), read in `key`'s shard."""
        shard0, mine = self.keys.shard(0), self.keys.of(key)
        for name in ("queue_index", "lease_index", "close_index", "unrecorded_index"):
            if index == getattr(shard0, name):
                index = getattr(mine, name)
        value = self.client.zscore(index, key)
        return None if value is None else float(value)

    def events(self, kind: str | None = None) -> list[dict[str, str]]:
        entries: list[tuple[str, dict[str, str]]] = []
        for shard in self.keys.all_shards:
            entries += cast(list[tuple[str, dict[str, str]]], self.client.xrange(shard.events))
        entries.sort(key=lambda e: tuple(int(p) for p in e[0].split("-")))
        return [f for _id, f in entries if kind is None or f.get("type") == kind]

    def indexes(self, key: str) -> dict[str, float | None]:
        k = self.keys
        return {
            "queue": self.score(k.queue_index, key),
            "lease": self.score(k.lease_index, key),
            "close": self.score(k.close_index, key),
            "unrecorded": self.score(k.unrecorded_index, key),
        }

    def state(self, key: str) -> tuple[dict[str, str], dict[str, float | None], int]:
        """Everything a transition could change: the hash, the indexes, the event count."""
        return self.hash(key), self.indexes(key), len(self.events())


#: The three Redis a ledger test runs on: a fixture takes them as its `params`.
REDIS_KINDS = ["fakeredis", "redis-server", "redis-cluster"]


def client_of(
    request: pytest.FixtureRequest, prefix: str, cluster_shards: int
) -> tuple[redis.Redis, KeySpace]:
    """A client of the Redis `request.param` names and a fresh key space on it (`cluster_shards`
    shards, hash-tagged, on the cluster; one elsewhere)."""
    keys = KeySpace(f"{prefix}{uuid.uuid4().hex[:10]}")
    if request.param == "fakeredis":
        client: redis.Redis = fakeredis.FakeRedis(
            server=fakeredis.FakeServer(), decode_responses=True
        )
    elif request.param == "redis-server":
        server = cast(RedisServer, request.getfixturevalue("redis_server"))
        client = redis.Redis.from_url(server.url, decode_responses=True)
    else:
        cluster = cast(RedisClusterNodes, request.getfixturevalue("redis_cluster"))
        client = redis_client(cluster.url)
        keys = KeySpace(keys.prefix, shards=cluster_shards, tagged=True)
    return client, keys


@pytest.fixture(params=REDIS_KINDS)
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    client, keys = client_of(request, "u", cluster_shards=3)

    def freeze(t: float) -> None:
        for shard in keys.all_shards:
            client.set(shard.clock, repr(t))

    knobs = Knobs(freeze=freeze)
    knobs.freeze(T0)
    ledger = Ledger(
        client,
        keys=keys,
        finished_ttl=FINISHED_TTL,
        jitter=lambda: knobs.jitter,
        clock_refresh=0.0,
    )
    for shard in keys.all_shards:
        rotated = ledger.rotate(expected_dataset="", dataset="test", epoch=EPOCH, shard=shard.index)
        assert rotated == (True, EPOCH)
    yield Rig(ledger, client, keys, knobs, join_epochs([EPOCH] * keys.shards))
    if request.param != "fakeredis":
        for name in list(client.scan_iter(match=f"{keys.prefix}:*")):
            client.delete(name)
    client.close()


def snapshot(effect: EffectClass, max_attempts: int | None = None) -> PolicySnapshot:
    attempts = max_attempts if max_attempts is not None else (3 if effect.retryable else 1)
    return PolicySnapshot(
        effect=effect,
        effect_source=EffectSource.POLICY,
        requires_approval=False,
        max_attempts=attempts,
        backoff_initial=B0,
        backoff_max=BMAX,
        schedule_to_start=S2S,
        start_to_close=S2C,
        heartbeat_timeout=HB,
        approval_timeout=60.0,
        secret_arguments=(),
    )


def opened(
    rig: Rig,
    effect: EffectClass = EffectClass.READ,
    *,
    max_attempts: int | None = None,
    key: str = "s/t/c",
) -> str:
    assert (
        rig.ledger.open(key, snapshot(effect, max_attempts), epoch=rig.epoch) is OpenResult.OPENED
    )
    return key


def claimed(
    rig: Rig,
    effect: EffectClass = EffectClass.READ,
    *,
    max_attempts: int | None = None,
    key: str = "s/t/c",
    fence: str = "f1",
) -> str:
    opened(rig, effect, max_attempts=max_attempts, key=key)
    assert rig.ledger.claim(key, 1, owner="w1", fence=fence).ok
    return key


def finished(step: Step, status: str, reason: str, attempt: int = 1) -> None:
    assert step.kind is StepKind.FINISHED, step
    assert (step.status, step.reason, step.attempt) == (status, reason, attempt), step
