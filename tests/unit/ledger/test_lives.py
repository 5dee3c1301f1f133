"""Ledger v2 script rules (docs/ledger.md): one clock, stale lives, who may lose an attempt.

Each test runs on fakeredis and on a real redis-server, like `test_ledger_scripts.py`, whose rig
it reuses.
"""

from __future__ import annotations

import time

import fakeredis
import pytest

from dex_celery.ledger.ledger import (
    Cause,
    ClaimKind,
    LoseMode,
    OpenResult,
    StepKind,
    join_epochs,
)
from dex_celery.model.policy import EffectClass
from tests.support.stores import ledger_rig


def _new_life(rig: ledger_rig.Rig, shards: tuple[int, ...] | None = None) -> str:
    """What the ledger guard does when Redis went back in time: a new epoch (of every shard, or
    of `shards`); returns the ledger's epoch afterwards."""
    epochs = []
    for shard in rig.keys.all_shards:
        if shards is not None and shard.index not in shards:
            epochs.append(ledger_rig.EPOCH)
            continue
        rotated, epoch = rig.ledger.rotate(
            expected_dataset="test", dataset="after", epoch="epoch-2", shard=shard.index
        )
        assert (rotated, epoch) == (True, "epoch-2")
        epochs.append(epoch)
    return join_epochs(epochs)


def test_a_rotation_makes_every_hash_of_the_old_life_stale(rig: ledger_rig.Rig) -> None:
    """S10.2: after a rollback no script acts on what the old life says."""
    running = ledger_rig.claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE, key="s/t/run")
    queued = ledger_rig.opened(rig, EffectClass.READ, key="s/t/queued")
    _new_life(rig)
    assert rig.ledger.live([running, queued]) == {running: False, queued: False}

    claim = rig.ledger.claim(queued, 1, owner="w2", fence="g")
    assert (claim.kind, claim.reason) == (ClaimKind.REFUSED, "stale_ledger")
    assert rig.ledger.heartbeat([(running, "f1")]) == {running}
    rig.knobs.advance(ledger_rig.S2C + 1)
    for move in (
        lambda k: rig.ledger.lose(k, None, mode=LoseMode.LAPSED, detail="x"),
        lambda k: rig.ledger.expire(k, None, unpublished=False, detail="x"),
        lambda k: rig.ledger.time_out(k, None, detail="x"),
    ):
        assert move(running).kind is StepKind.NOOP
        assert move(queued).kind is StepKind.NOOP
    # The sweeper's scans drop them, so they are not read again and again.
    for key in (running, queued):
        indexes = rig.indexes(key)
        assert (indexes["queue"], indexes["lease"], indexes["close"]) == (None, None, None)
    # The worker of the old life finishes: evidence only, never an outcome.
    step = rig.ledger.finish(running, 1, fence="f1", cause=Cause.OK, payload="1")
    assert step.kind is StepKind.LATE
    assert rig.hash(running)["status"] == "active"


def test_open_in_the_new_life_replaces_a_stale_hash(rig: ledger_rig.Rig) -> None:
    key = ledger_rig.claimed(rig, EffectClass.READ)
    new = _new_life(rig)
    assert rig.ledger.open(
        key, ledger_rig.snapshot(EffectClass.READ), epoch=new, may_have_run=True
    ) is (OpenResult.OPENED)
    h = rig.hash(key)
    assert (h["epoch"], h["n"], h["state"], h["reached"]) == ("epoch-2", "1", "enqueued", "1")
    assert rig.ledger.live([key]) == {key: True}
    # An open under the old epoch (a requester that has not looked yet) opens nothing.
    assert rig.ledger.open("s/t/new", ledger_rig.snapshot(EffectClass.READ), epoch=rig.epoch) is (
        OpenResult.EPOCH_CHANGED
    )


def test_a_new_life_of_one_shard_leaves_the_other_shards_live(rig: ledger_rig.Rig) -> None:
    """docs/redis.md, "Redis Cluster": a failover of one primary starts a new life for the
    shards it held, and only those; calls of the other shards go on as they were."""
    if rig.keys.shards == 1:
        pytest.skip("one shard: its life is the ledger's")
    keys = {rig.keys.shard_of(f"s/t/c{i}"): f"s/t/c{i}" for i in range(50)}
    assert sorted(keys) == [0, 1, 2]
    for key in keys.values():
        ledger_rig.claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE, key=key)
    new = _new_life(rig, shards=(1,))
    assert new == join_epochs([ledger_rig.EPOCH, "epoch-2", ledger_rig.EPOCH])
    assert rig.ledger.live(list(keys.values())) == {
        keys[0]: True,
        keys[1]: False,
        keys[2]: True,
    }
    assert rig.ledger.heartbeat([(key, "f1") for key in keys.values()]) == {keys[1]}
    step = rig.ledger.finish(keys[2], 1, fence="f1", cause=Cause.OK, payload="1")
    ledger_rig.finished(step, "succeeded", "ok")
    assert rig.ledger.finish(keys[1], 1, fence="f1", cause=Cause.OK, payload="1").kind is (
        StepKind.LATE
    )
    # A call of the renewed shard opens under the new epoch; the others' epochs are unchanged.
    assert (
        rig.ledger.open("s/t/x1", ledger_rig.snapshot(EffectClass.READ), epoch=new)
        is OpenResult.OPENED
    )


def test_rotation_is_compare_and_set(rig: ledger_rig.Rig) -> None:
    """Two sweepers noticing the same rollback start one new life, not two."""
    assert rig.ledger.rotate(expected_dataset="test", dataset="a", epoch="e-a") == (True, "e-a")
    assert rig.ledger.rotate(expected_dataset="test", dataset="b", epoch="e-b") == (False, "e-a")


def test_worker_lost_ends_only_the_attempt_of_the_process_that_died(rig: ledger_rig.Rig) -> None:
    """A duplicate delivery that died before its claim must not end another process's run."""
    key = ledger_rig.claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    other = rig.ledger.lose(key, 1, mode=LoseMode.WORKER_LOST, owner="w9", detail="died")
    assert other.kind is StepKind.NOOP
    nobody = rig.ledger.lose(key, 1, mode=LoseMode.WORKER_LOST, detail="died")
    assert nobody.kind is StepKind.NOOP
    assert rig.hash(key)["state"] == "running"
    step = rig.ledger.lose(key, 1, mode=LoseMode.WORKER_LOST, owner="w1", detail="died")
    ledger_rig.finished(step, "outcome_unknown", "lost")


def test_released_needs_the_fence_of_the_claim(rig: ledger_rig.Rig) -> None:
    """A worker refused by the write fence gives up its own attempt only."""
    key = ledger_rig.claimed(rig, EffectClass.UNCLASSIFIED, fence="mine")
    assert rig.ledger.lose(key, 1, mode=LoseMode.RELEASED, fence="other", detail="x").kind is (
        StepKind.NOOP
    )
    step = rig.ledger.lose(key, 1, mode=LoseMode.RELEASED, fence="mine", detail="refused")
    ledger_rig.finished(step, "outcome_unknown", "lost")


def test_a_retry_claims_only_after_its_backoff_on_the_ledger_clock(rig: ledger_rig.Rig) -> None:
    key = ledger_rig.claimed(rig, EffectClass.READ)
    rig.knobs.jitter = 1.0
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.RETRYABLE, payload="blip")
    assert (step.kind, step.delay) == (StepKind.RETRY, 1.0)
    early = rig.ledger.claim(key, 2, owner="w", fence="f2")
    assert (early.kind, early.wait) == (ClaimKind.EARLY, pytest.approx(1.0))
    assert rig.hash(key)["state"] == "enqueued"
    assert "refused" not in rig.hash(key)
    rig.knobs.advance(0.4)
    assert rig.ledger.claim(key, 2, owner="w", fence="f2").wait == pytest.approx(0.6)
    rig.knobs.advance(0.6)
    assert rig.ledger.claim(key, 2, owner="w", fence="f2").ok


def test_times_come_from_redis_not_from_the_caller(
    rig: ledger_rig.Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S10.1: a host clock an hour off changes nothing the scripts store or compare."""
    if isinstance(rig.client, fakeredis.FakeRedis):
        pytest.skip("fakeredis's TIME is the test process's own clock; real Redis only")
    rig.client.delete(rig.keys.clock)  # the real clock of the server
    server_now = float(rig.client.time()[0])
    monkeypatch.setattr(time, "time", lambda: server_now + 3600)
    key = ledger_rig.opened(rig, EffectClass.READ)
    h = rig.hash(key)
    assert abs(float(h["opened_at"]) - server_now) < 5
    assert abs(float(h["deadline"]) - (server_now + ledger_rig.S2S)) < 5
    assert rig.ledger.claim(key, 1, owner="w", fence="f").ok  # not "expired"
    assert abs(float(rig.hash(key)["lease"]) - (server_now + ledger_rig.HB)) < 5
    assert abs(rig.ledger.now() - server_now) < 5
    assert server_now > ledger_rig.T0
