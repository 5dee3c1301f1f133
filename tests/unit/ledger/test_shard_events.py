"""Event readers on a sharded ledger (S7.3; docs/redis.md, "Redis Cluster"): every shard's
stream is read, merged by entry id, and a position resumes after exactly what was seen.

Runs on the rig of `tests/support/stores/ledger_rig.py`: fakeredis and a redis-server (one stream, positions as
before) and a real Redis Cluster with three shards (one stream per shard)."""

from __future__ import annotations

from dex_celery.ledger.events import NOW, START
from dex_celery.model.policy import EffectClass
from tests.support.stores.ledger_rig import Rig, opened


def _keys(rig: Rig, n: int) -> list[str]:
    return [f"s/t/e{i}" for i in range(n)]


def test_readers_see_every_shards_events_once_and_resume_exactly(rig: Rig) -> None:
    keys = _keys(rig, 12)
    if rig.keys.shards > 1:
        assert {rig.keys.shard_of(k) for k in keys} == set(range(rig.keys.shards))
    for key in keys[:6]:
        opened(rig, EffectClass.READ, key=key)
    events = rig.ledger.events
    first = list(events.iterate(START))
    # Across shards, events of the same millisecond have no order; within a shard they keep it.
    assert sorted(e.key for e in first) == sorted(keys[:6])
    assert all(e.type == "tool_call_requested" for e in first)
    for shard in rig.keys.all_shards:
        mine = [k for k in keys[:6] if rig.keys.shard_of(k) == shard.index]
        assert [e.key for e in first if rig.keys.shard_of(e.key) == shard.index] == mine
    seen = [e.key for e in first[:3]]
    for key in keys[6:]:
        opened(rig, EffectClass.READ, key=key)
    # Resuming after the third event sees each later one exactly once, on every shard.
    later = [e.key for e in events.iterate(first[2].position)]
    assert sorted(later) == sorted(set(keys) - set(seen))
    assert sorted(e.key for e in events.iterate(first[-1].position)) == sorted(keys[6:])
    assert events.length() == 12
    assert not events.trimmed_after(first[2].position)
    # Timestamps come from each event's own stream id, not from the joined position.
    assert all(abs(e.timestamp - first[0].timestamp) < 60 for e in first)


def test_now_reads_only_what_comes_after(rig: Rig) -> None:
    events = rig.ledger.events
    for key in _keys(rig, 3):
        opened(rig, EffectClass.READ, key=key)
    position = events.latest_position()
    assert list(events.iterate(position)) == []
    assert list(events.iterate(NOW)) == []
    opened(rig, EffectClass.READ, key="s/t/later")
    assert [e.key for e in events.iterate(position)] == ["s/t/later"]


def test_events_published_outside_scripts_go_to_the_calls_shard(rig: Rig) -> None:
    """A finished event of a call without a ledger entry lands in its shard's stream, so a
    reader's position of that shard covers it."""
    position = rig.ledger.events.publish_finished("s/t/x", status="rejected", error="no")
    shard = rig.keys.of("s/t/x")
    assert [i for i, _ in rig.client.xrange(shard.events)] == [position]
    (event,) = list(rig.ledger.events.iterate(START))
    assert (event.key, event.status) == ("s/t/x", "rejected")
