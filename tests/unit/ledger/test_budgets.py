"""Write budgets in the ledger's scripts (S13.1): reserve at open, settle at record, hold while
unknown, rebuild from SQL in a new life. On fakeredis (Lua), a redis-server and a Redis Cluster
(the ledger of one shard, tagged, so a budget's scope shares the calls' slot)."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest
import redis
from redis.cluster import RedisCluster

from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Ledger, OpenReply, OpenResult
from dex_celery.model.policy import EffectClass
from tests.support.stores.ledger_rig import (
    EPOCH,
    REDIS_KINDS,
    T0,
    Knobs,
    Rig,
    client_of,
    snapshot,
)

WRITE = snapshot(EffectClass.NON_IDEMPOTENT_WRITE)


@pytest.fixture(params=REDIS_KINDS)
def brig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    client, keys = client_of(request, "b", cluster_shards=1)
    knobs = Knobs(freeze=lambda t: client.set(keys.clock, repr(t)))
    knobs.freeze(T0)
    ledger = Ledger(client, keys=keys, clock_refresh=0.0)
    assert ledger.rotate(expected_dataset="", dataset=marker(client, keys), epoch=EPOCH) == (
        True,
        EPOCH,
    )
    yield Rig(ledger, client, keys, knobs)
    if request.param != "fakeredis":
        for name in list(client.scan_iter(match=f"*{keys.prefix}*")):
            client.delete(name)
    client.close()


def marker(client: redis.Redis, keys: KeySpace) -> str:
    """The rollback guard's marker of the server holding the ledger (`ledger/guard.py`)."""
    if isinstance(client, fakeredis.FakeRedis):
        return "test"
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(keys.epoch)
        server = client.info("server", target_nodes=node)
        stats = client.info("stats", target_nodes=node)
    else:
        server, stats = client.info("server"), client.info("stats")
    return f"{server['run_id']}:{stats.get('evicted_keys', 0)}"


def scope(rig: Rig, name: str = "refunds") -> str:
    return rig.ledger.keys.budget(name, "session:s")


def open_charged(
    rig: Rig, key: str, *, limit: int = 2, amount: int = 1, window: float = 0.0, force: bool = False
) -> OpenReply:
    (reply,) = rig.ledger.open_replies(
        [(key, WRITE)],
        epoch=rig.epoch,
        budgets=[[(scope(rig), limit, amount, window, force)]],
    )
    if reply.result is OpenResult.REBUILD:  # a scope never used: SQL holds no charge of it
        rig.ledger.seed_budget(scope(rig), epoch=rig.epoch, window=window, charges=())
        return open_charged(rig, key, limit=limit, amount=amount, window=window, force=force)
    return reply


def end(rig: Rig, key: str, status: str) -> None:
    """The call's outcome decided and recorded (the unrecorded index, then `recorded`)."""
    rig.client.zadd(rig.keys.of(key).unrecorded_index, {key: T0})
    assert rig.ledger.recorded(key, status=status, error="")


def totals(rig: Rig, window: float = 0.0) -> tuple[float, float, float] | None:
    return rig.ledger.read_budget(scope(rig), window=window)


def test_an_unknown_scope_is_rebuilt_before_anything_is_admitted(brig: Rig) -> None:
    """S13.1: a scope the ledger does not hold (never used, expired, or lost) is counted from
    SQL first; the open writes nothing meanwhile."""
    (reply,) = brig.ledger.open_replies(
        [("s/t/1", WRITE)], epoch=brig.epoch, budgets=[[(scope(brig), 2, 1, 0.0, False)]]
    )
    assert reply == OpenReply(OpenResult.REBUILD, 0)
    assert brig.hash("s/t/1") == {}
    assert totals(brig) is None


def test_count_budget_admits_exactly_its_limit(brig: Rig) -> None:
    """S13.1: the third call over a budget of 2 opens nothing and says what is used."""
    assert open_charged(brig, "s/t/1").result is OpenResult.OPENED
    assert open_charged(brig, "s/t/2").result is OpenResult.OPENED
    over = open_charged(brig, "s/t/3")
    assert over == OpenReply(OpenResult.OVER_BUDGET, 0, reserved=2.0, spent=0.0, held=0.0)
    assert brig.hash("s/t/3") == {}
    assert brig.hash("s/t/1")["budgets"] == scope(brig)
    assert totals(brig) == (2.0, 0.0, 0.0)


def test_amount_budget_sums_the_argument(brig: Rig) -> None:
    assert open_charged(brig, "s/t/1", limit=1000, amount=600).result is OpenResult.OPENED
    over = open_charged(brig, "s/t/2", limit=1000, amount=500)
    assert over.result is OpenResult.OVER_BUDGET and over.reserved == 600.0
    assert open_charged(brig, "s/t/3", limit=1000, amount=400).result is OpenResult.OPENED
    assert totals(brig) == (1000.0, 0.0, 0.0)


def test_states_follow_the_recorded_status(brig: Rig) -> None:
    """Reserved -> spent (succeeded), released (failed: usable again), held (outcome_unknown)."""
    for n in (1, 2):
        assert open_charged(brig, f"s/t/{n}").result is OpenResult.OPENED
    end(brig, "s/t/1", "succeeded")
    end(brig, "s/t/2", "failed")
    assert totals(brig) == (0.0, 1.0, 0.0)
    assert open_charged(brig, "s/t/3").result is OpenResult.OPENED  # the released unit
    end(brig, "s/t/3", "outcome_unknown")
    assert totals(brig) == (0.0, 1.0, 1.0)
    assert open_charged(brig, "s/t/4").result is OpenResult.OVER_BUDGET


def test_reconciliation_settles_a_held_charge(brig: Rig) -> None:
    """Held until reconciled: "did not run" releases (the next call may use it), "went
    through" spends."""
    assert open_charged(brig, "s/t/1", limit=1).result is OpenResult.OPENED
    end(brig, "s/t/1", "outcome_unknown")
    assert open_charged(brig, "s/t/2", limit=1).result is OpenResult.OVER_BUDGET
    assert brig.ledger.settle_budgets("s/t/1", [scope(brig)], went_through=False) == 1
    assert totals(brig) == (0.0, 0.0, 0.0)
    assert open_charged(brig, "s/t/2", limit=1).result is OpenResult.OPENED
    end(brig, "s/t/2", "outcome_unknown")
    assert brig.ledger.settle_budgets("s/t/2", [scope(brig)], went_through=True) == 1
    assert totals(brig) == (0.0, 1.0, 0.0)
    # Settling again, or settling a spent charge, moves nothing.
    assert brig.ledger.settle_budgets("s/t/2", [scope(brig)], went_through=False) == 0
    assert totals(brig) == (0.0, 1.0, 0.0)


def test_a_rolling_window_forgets_what_was_spent_before_it(brig: Rig) -> None:
    assert open_charged(brig, "s/t/1", limit=1, window=60.0).result is OpenResult.OPENED
    end(brig, "s/t/1", "succeeded")
    assert open_charged(brig, "s/t/2", limit=1, window=60.0).result is OpenResult.OVER_BUDGET
    brig.knobs.advance(61.0)
    assert open_charged(brig, "s/t/2", limit=1, window=60.0).result is OpenResult.OPENED
    # Reserved (or held) charges never age out: they may still take effect.
    brig.knobs.advance(600.0)
    assert open_charged(brig, "s/t/3", limit=1, window=60.0).result is OpenResult.OVER_BUDGET


def test_a_persons_approval_admits_over_the_budget(brig: Rig) -> None:
    assert open_charged(brig, "s/t/1", limit=1).result is OpenResult.OPENED
    assert open_charged(brig, "s/t/2", limit=1, force=True).result is OpenResult.OPENED
    assert totals(brig) == (2.0, 0.0, 0.0)


def test_a_new_life_rebuilds_the_scope_from_sql(brig: Rig) -> None:
    """Redis went back in time: the scope of the old life is not trusted; the seed (what SQL
    counts) is written once, compare-and-set, and a charge it holds already is not counted
    twice when its call is opened again."""
    assert open_charged(brig, "s/t/1", limit=2).result is OpenResult.OPENED
    now = marker(brig.client, brig.keys)
    assert brig.ledger.rotate(expected_dataset=now, dataset=now, epoch="epoch-2") == (
        True,
        "epoch-2",
    )
    brig.epoch = "epoch-2"
    (reply,) = brig.ledger.open_replies(
        [("s/t/2", WRITE)], epoch="epoch-2", budgets=[[(scope(brig), 2, 1, 0.0, False)]]
    )
    assert reply.result is OpenResult.REBUILD
    seed = [("s/t/1", "r", 1, T0), ("s/t/0", "h", 1, T0)]
    assert brig.ledger.seed_budget(scope(brig), epoch="epoch-2", window=0.0, charges=seed) == (
        "seeded"
    )
    assert brig.ledger.seed_budget(scope(brig), epoch="epoch-2", window=0.0, charges=()) == (
        "current"
    )
    assert totals(brig) == (1.0, 0.0, 1.0)
    assert open_charged(brig, "s/t/2").result is OpenResult.OVER_BUDGET
    # s/t/1 reopened in the new life keeps its one charge.
    assert open_charged(brig, "s/t/1").result is OpenResult.OPENED
    assert totals(brig) == (1.0, 0.0, 1.0)


def test_a_server_that_went_back_in_time_admits_nothing(brig: Rig) -> None:
    """S13.1, S10.2: a scope read on a server the marker does not name (restarted from an older
    snapshot, a promoted replica) may hold fewer charges than were admitted: the open admits
    nothing and asks for a new life (an emulator cannot go back in time)."""
    if isinstance(brig.client, fakeredis.FakeRedis):
        pytest.skip("fakeredis has no server identity (INFO)")
    assert open_charged(brig, "s/t/1").result is OpenResult.OPENED
    brig.client.set(brig.keys.dataset, "an-older-server:0")
    (reply,) = brig.ledger.open_replies(
        [("s/t/2", WRITE)], epoch=brig.epoch, budgets=[[(scope(brig), 2, 1, 0.0, False)]]
    )
    assert reply.result is OpenResult.EPOCH_CHANGED
    assert brig.hash("s/t/2") == {}
    assert totals(brig) == (1.0, 0.0, 0.0)


def test_a_pending_call_a_rebuild_counted_is_judged_again_without_itself(brig: Rig) -> None:
    """A rebuild counts every call SQL shows pending and unclaimed as reserved (p), but such a
    call is not admitted for having been counted: its open judges it against the others. Of
    three such calls under a budget of two, the first judged waits and the other two run."""
    seed = [(f"s/t/{n}", "p", 1, T0) for n in (1, 2, 3)]
    assert brig.ledger.seed_budget(scope(brig), epoch=brig.epoch, window=0.0, charges=seed) == (
        "seeded"
    )
    assert totals(brig) == (3.0, 0.0, 0.0)
    over = open_charged(brig, "s/t/1")
    assert over == OpenReply(OpenResult.OVER_BUDGET, 0, reserved=2.0, spent=0.0, held=0.0)
    assert totals(brig) == (2.0, 0.0, 0.0)  # no longer in flight
    assert open_charged(brig, "s/t/2").result is OpenResult.OPENED
    assert open_charged(brig, "s/t/3").result is OpenResult.OPENED
    assert open_charged(brig, "s/t/4").result is OpenResult.OVER_BUDGET
    assert totals(brig) == (2.0, 0.0, 0.0)
