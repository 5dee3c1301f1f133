"""`claim`, `finish` and `recorded` on the held connection (`ledger/hot.py`), on a real
redis-server: what redis-py's generic path survives, the packed path survives too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devtools.processes import RedisServer
from dex_celery.ledger.connection import redis_client
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Cause, Ledger, StepKind
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.settings import Settings

EPOCH = "e1"
SNAPSHOT = resolve_policy(ToolPolicy(effect=EffectClass.READ), None, None, Settings())


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    server = RedisServer(tmp_path / "redis").start()
    client = redis_client(server.url)
    led = Ledger(client, keys=KeySpace("hot"))
    led.rotate(expected_dataset="", dataset="d", epoch=EPOCH)
    yield led
    client.close()
    server.kill()


def _call(ledger: Ledger, key: str) -> None:
    ledger.open(key, SNAPSHOT, epoch=EPOCH)
    claim = ledger.claim(key, 1, owner="w1", fence="f1")
    assert claim.ok and claim.effect == "read" and claim.heartbeat_timeout > 0
    step = ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload='{"n":1}')
    assert step.kind is StepKind.FINISHED and step.status == "succeeded"


def test_the_packed_path_is_used_and_agrees_with_the_ledger(ledger: Ledger) -> None:
    assert ledger.hot is not None
    _call(ledger, "s/t/c1")
    entry = ledger.read("s/t/c1")
    assert entry is not None and entry.status == "succeeded" and entry.result == '{"n":1}'
    # A repeat of the same fence's finish is a noop, as on the generic path.
    again = ledger.finish("s/t/c1", 1, fence="f1", cause=Cause.OK, payload="{}")
    assert again.kind is StepKind.NOOP


def test_a_flushed_script_cache_is_loaded_again(ledger: Ledger) -> None:
    _call(ledger, "s/t/warm")
    ledger.client.script_flush()
    _call(ledger, "s/t/after-flush")


def test_a_killed_connection_is_replaced(ledger: Ledger) -> None:
    _call(ledger, "s/t/warm")
    held = ledger.hot._free if ledger.hot is not None else []
    assert held, "the packed path keeps its connection"
    killer = redis.Redis(connection_pool=ledger.client.connection_pool)
    ids = [c["id"] for c in killer.client_list() if c.get("cmd") == "evalsha"]
    for client_id in ids:
        killer.client_kill_filter(_id=client_id)
    _call(ledger, "s/t/after-kill")


def test_a_script_error_is_a_ledger_error_and_keeps_the_connection(ledger: Ledger) -> None:
    from dex_celery.errors import LedgerError

    ledger.open("s/t/c1", SNAPSHOT, epoch=EPOCH)
    # A call hash of the wrong type makes the script fail inside Redis.
    ledger.client.delete(ledger.keys.call("s/t/bad"))
    ledger.client.set(ledger.keys.call("s/t/bad"), "not a hash")
    with pytest.raises(LedgerError, match="ledger script claim failed"):
        ledger.claim("s/t/bad", 1, owner="w1", fence="f1")
    assert ledger.claim("s/t/c1", 1, owner="w1", fence="f1").ok


def test_a_restarted_redis_without_the_scripts_is_served_again(tmp_path: Path) -> None:
    """The held connection closed by a restart and the script cache empty: one call later the
    packed path has reconnected and loaded the script again."""
    server = RedisServer(tmp_path / "redis").start()
    client = redis_client(server.url)
    ledger = Ledger(client, keys=KeySpace("hot"))
    try:
        ledger.rotate(expected_dataset="", dataset="d", epoch=EPOCH)
        _call(ledger, "s/t/warm")
        killer = redis.Redis(connection_pool=client.connection_pool)
        for c in killer.client_list():
            if c.get("cmd") == "evalsha":
                killer.client_kill_filter(_id=c["id"])
        client.script_flush()
        _call(ledger, "s/t/after-restart")
    finally:
        client.close()
        server.kill()


def _finished_events(ledger: Ledger) -> list[str]:
    entries = ledger.client.xrange(ledger.keys.events)
    return [f["key"] for _id, f in entries if f.get("type") == "tool_call_finished"]


def test_a_batch_of_recorded_is_one_packed_round_trip_announcing_each_call_once(
    ledger: Ledger,
) -> None:
    _call(ledger, "s/t/warm")
    assert ledger.recorded("s/t/warm", status="succeeded", error="") is True  # script loaded
    keys = [f"s/t/r{i}" for i in range(4)]
    for key in keys:
        _call(ledger, key)
    before = ledger.client.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert ledger.recorded_many([(k, "succeeded", "") for k in keys]) == [True] * 4
    # One EVALSHA per outcome, no SCRIPT EXISTS or other command beside them.
    stats = ledger.client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] - before == 4
    assert "cmdstat_script|exists" not in stats
    assert _finished_events(ledger) == ["s/t/warm", *keys]
    for key in keys:  # out of the unrecorded index, the entry left to expire
        assert ledger.client.zscore(ledger.keys.of(key).unrecorded_index, key) is None
        assert ledger.client.ttl(ledger.keys.call(key)) > 0
    # A repeat (a second writer, a resent batch) announces nothing.
    assert ledger.recorded_many([(k, "succeeded", "") for k in keys]) == [False] * 4
    assert ledger.recorded(keys[0], status="succeeded", error="") is False
    assert _finished_events(ledger) == ["s/t/warm", *keys]


def test_a_batch_of_recorded_survives_a_flushed_cache_and_a_killed_connection(
    ledger: Ledger,
) -> None:
    keys = [f"s/t/k{i}" for i in range(3)]
    for key in keys:
        _call(ledger, key)
    assert ledger.recorded_many([(keys[0], "succeeded", "")]) == [True]
    killer = redis.Redis(connection_pool=ledger.client.connection_pool)
    for c in killer.client_list():
        if c.get("cmd") == "evalsha":
            killer.client_kill_filter(_id=c["id"])
    ledger.client.script_flush()
    assert ledger.recorded_many([(k, "succeeded", "") for k in keys[1:]]) == [True, True]
    assert _finished_events(ledger) == keys


def test_a_failing_script_in_a_batch_is_a_ledger_error_and_the_connection_stays_usable(
    ledger: Ledger,
) -> None:
    from dex_celery.errors import LedgerError

    _call(ledger, "s/t/good")
    bad = ledger.keys.of("s/t/bad").unrecorded_index
    ledger.client.delete(bad)
    ledger.client.set(bad, "not a sorted set")  # ZREM fails inside the script
    with pytest.raises(LedgerError, match="ledger script recorded failed"):
        ledger.recorded_many([("s/t/good", "succeeded", ""), ("s/t/bad", "succeeded", "")])
    ledger.client.delete(bad)
    # Every reply of the failed batch was read: the next call's reply is its own.
    _call(ledger, "s/t/next")
    assert ledger.recorded_many([("s/t/next", "succeeded", "")]) == [True]


def test_finish_reports_the_decision_time_the_entry_holds(ledger: Ledger) -> None:
    """The worker records `finish`'s reply, the sweeper and a waiting caller the entry: both
    must give SQL the same `finished_at` (it once lost its last digits in the reply)."""
    ledger.open("s/t/time", SNAPSHOT, epoch=EPOCH)
    assert ledger.claim("s/t/time", 1, owner="w1", fence="f1").ok
    step = ledger.finish("s/t/time", 1, fence="f1", cause=Cause.OK, payload="{}")
    entry = ledger.read("s/t/time")
    assert entry is not None and step.finished_at is not None
    assert step.finished_at == entry.finished_at
