"""Ledger shards (docs/redis.md, "Redis Cluster"): one slot per script, unchanged single-node
names, settings that refuse what a cluster cannot do."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from dex_celery import Settings
from dex_celery.errors import ConfigurationError, InvalidEventPosition
from dex_celery.ledger.connection import cluster_nodes
from dex_celery.ledger.events import check_position
from dex_celery.ledger.keys import CLUSTER_SLOTS, KeySpace
from dex_celery.ledger.ledger import join_epochs, shard_epoch


def _slot(name: str) -> int:
    return int(key_slot(name.encode()))


def test_one_shard_on_a_single_redis_keeps_every_key_name() -> None:
    """An existing deployment changes nothing: the names of the single-node layout."""
    keys = KeySpace("dex")
    assert (keys.call("s/t/c"), keys.running("s/t/c")) == (
        "dex:call:{s/t/c}",
        "dex:running:{s/t/c}",
    )
    assert (keys.queue_index, keys.lease_index, keys.close_index, keys.unrecorded_index) == (
        "dex:idx:queue",
        "dex:idx:lease",
        "dex:idx:close",
        "dex:idx:unrecorded",
    )
    assert (keys.epoch, keys.dataset, keys.clock, keys.events) == (
        "dex:epoch",
        "dex:dataset",
        "dex:clock",
        "dex:events",
    )
    assert (keys.ledger_id, keys.stats, keys.webhook_due) == (
        "dex:ledger",
        "dex:stats",
        "dex:webhooks:due",
    )
    assert keys.shard_of("s/t/c") == 0 and len(keys.all_shards) == 1


@pytest.mark.parametrize("shards", [1, 3, 6, 16])
def test_every_key_a_script_touches_lies_in_its_shards_one_slot(shards: int) -> None:
    keys = KeySpace("dex", shards=shards, tagged=True)
    for i in range(200):
        key = f"s{i}/t/c{i}"
        shard = keys.of(key)
        names = [
            keys.call(key),
            keys.running(key),
            shard.queue_index,
            shard.lease_index,
            shard.close_index,
            shard.unrecorded_index,
            shard.events,
            shard.epoch,
            shard.dataset,
            shard.clock,
            shard.replayed("e"),
        ]
        assert len({_slot(n) for n in names}) == 1, names
    # The deployment-wide keys share one slot too (webhooks use MULTI across them).
    shared = [keys.ledger_id, keys.stats, keys.sweep_stats, keys.webhook_cursor, keys.webhook_due]
    assert len({_slot(n) for n in shared}) == 1


@pytest.mark.parametrize("shards", [3, 6, 16])
def test_shards_spread_over_equal_slot_ranges(shards: int) -> None:
    """Shard i's slot is in the i-th of `shards` equal ranges, so the primaries of a cluster
    made with equal ranges serve as many shards each."""
    keys = KeySpace("dex", shards=shards)
    for shard in keys.all_shards:
        low = shard.index * CLUSTER_SLOTS // shards
        high = (shard.index + 1) * CLUSTER_SLOTS // shards
        assert low <= _slot(shard.epoch) < high
    counts = [0] * shards
    for i in range(3000):
        counts[keys.shard_of(f"s/t/c{i}")] += 1
    assert min(counts) > 3000 / shards / 2  # calls spread over the shards


def test_a_shards_epoch_within_the_joined_epoch() -> None:
    joined = join_epochs(["a", "b", "c"])
    assert [shard_epoch(joined, i, 3) for i in range(3)] == ["a", "b", "c"]
    assert shard_epoch("a", 0, 1) == "a"
    # An epoch of another shard count never matches a shard's: the open asks again.
    assert shard_epoch("a", 1, 3) == ""


def test_event_positions_of_a_sharded_ledger() -> None:
    assert check_position("1-0,2-3,0-0") == "1-0,2-3,0-0"
    with pytest.raises(InvalidEventPosition):
        check_position("1-0,,2-0")


def test_settings_of_a_cluster_ledger() -> None:
    base = {"redis_url": "redis+cluster://10.0.0.1:7000", "broker_url": "redis://10.0.0.9/0"}
    assert Settings(**base).ledger_cluster
    assert Settings(
        redis_url="redis://h:1/0", redis_cluster=True, broker_url="amqp://x"
    ).ledger_cluster
    assert not Settings().ledger_cluster
    with pytest.raises(ConfigurationError, match="DEX_BROKER_URL"):
        Settings(redis_url="redis+cluster://10.0.0.1:7000")
    with pytest.raises(ConfigurationError, match="claim_replicas"):
        Settings(**base, claim_replicas=1)
    with pytest.raises(ConfigurationError, match="ledger_shards"):
        Settings(ledger_shards=0)


def test_a_cluster_url_names_every_startup_node() -> None:
    """A client started while the first node named is down must still find the cluster."""
    first, nodes = cluster_nodes("redis+cluster://u:secret@10.0.0.1:7000,10.0.0.2:7001/0")
    assert first == "redis://u:secret@10.0.0.1:7000/0"
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    with pytest.raises(ConfigurationError, match="host:port"):
        cluster_nodes("redis+cluster://10.0.0.1")
