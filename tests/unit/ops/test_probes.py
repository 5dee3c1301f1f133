"""The liveness tick of a worker's main loop and the words of a readiness verdict
(docs/operations.md, "Probes")."""

from __future__ import annotations

import pytest

from dex_celery.errors import NotAlive
from dex_celery.ops.probes import TICK_STALE_AFTER, LoopTick, Verdict


def test_a_loop_is_alive_only_between_its_first_tick_and_a_stale_one() -> None:
    now = [100.0]
    tick = LoopTick(clock=lambda: now[0])
    with pytest.raises(NotAlive, match="not started yet"):
        tick.require_alive()
    tick.tick()
    now[0] += TICK_STALE_AFTER
    assert tick.require_alive().startswith("the main loop ticked")
    now[0] += 1
    with pytest.raises(NotAlive, match="last ticked 61s ago"):
        tick.require_alive()


def test_a_verdict_names_failed_parts_and_error_types_only() -> None:
    assert Verdict(("database", "redis")).text() == "ready (database, redis)"
    failed = Verdict(("database", "redis"), (("redis", "RedisUnavailable"),))
    assert not failed.ok
    assert failed.text() == "not ready: redis (RedisUnavailable)"
