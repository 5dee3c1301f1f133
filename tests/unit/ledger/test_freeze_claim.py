"""The write freeze in the claim script (docs/semantics.md, S13.2), on fakeredis, a real
redis-server and a real Redis Cluster split into three shards (each shard's copy of the freeze
lives in the slot of its calls, so the claim reads it in its own MGET: `claim.lua`).
"""

from __future__ import annotations

import json

from dex_celery.ledger.freeze import ledger_copy
from dex_celery.ledger.ledger import ClaimKind, OpenResult
from dex_celery.model.freeze import ALL_TOOLS, FreezeMode, WriteFreeze, parse_entry
from dex_celery.model.policy import EffectClass
from tests.support.stores.ledger_rig import T0, Rig, opened, snapshot
from tests.support.stores.ledger_rig import rig as rig

WRITES = (EffectClass.NON_IDEMPOTENT_WRITE, EffectClass.UNCLASSIFIED, EffectClass.IDEMPOTENT_WRITE)


def frozen(rig: Rig, *tools: str, since: float = T0 - 1) -> None:
    rig.ledger.set_freezes(
        ledger_copy(
            [
                WriteFreeze(n + 1, tool, FreezeMode.HOLD, "incident", "ann", since)
                for n, tool in enumerate(tools or (ALL_TOOLS,))
            ]
        )
    )


def test_every_write_class_meets_a_freeze_and_leaves_the_ledger(rig: Rig) -> None:
    """A held call has no ledger entry (S6.1): the hash and its queue entry go, atomically with
    the refusal, and `tool_call_frozen` says so."""
    frozen(rig)
    for n, effect in enumerate(WRITES):
        key = opened(rig, effect, key=f"s/t/w{n}")
        claim = rig.ledger.claim(key, 1, owner="w1", fence="f1", tool="refund")
        assert claim.kind is ClaimKind.FROZEN, (effect, claim)
        assert parse_entry(claim.freeze).frozen_by == "ann" and not claim.reached
        assert rig.hash(key) == {} and rig.indexes(key)["queue"] is None
    assert len(rig.events("tool_call_frozen")) == len(WRITES)


def test_reads_never_meet_a_freeze(rig: Rig) -> None:
    frozen(rig)
    key = opened(rig, EffectClass.READ)
    assert rig.ledger.claim(key, 1, owner="w1", fence="f1", tool="lookup").ok


def test_a_freeze_of_one_tool_leaves_the_others(rig: Rig) -> None:
    frozen(rig, "refund")
    other = opened(rig, EffectClass.NON_IDEMPOTENT_WRITE, key="s/t/other")
    assert rig.ledger.claim(other, 1, owner="w1", fence="f1", tool="email").ok
    mine = opened(rig, EffectClass.NON_IDEMPOTENT_WRITE, key="s/t/mine")
    assert rig.ledger.claim(mine, 1, owner="w1", fence="f1", tool="refund").kind is ClaimKind.FROZEN


def test_a_thaw_lets_the_next_claim_through(rig: Rig) -> None:
    frozen(rig)
    rig.ledger.set_freezes("")
    key = opened(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    assert rig.ledger.claim(key, 1, owner="w1", fence="f1", tool="refund").ok
    assert rig.ledger.read_freezes() == [None] * rig.keys.shards


def test_an_approval_later_than_the_freeze_passes_an_earlier_one_does_not(rig: Rig) -> None:
    frozen(rig, since=T0 - 10)
    write = snapshot(EffectClass.NON_IDEMPOTENT_WRITE)
    after, before = "s/t/after", "s/t/before"
    assert rig.ledger.open(after, write, epoch=rig.epoch, passed=T0 - 5) is OpenResult.OPENED
    assert rig.ledger.open(before, write, epoch=rig.epoch, passed=T0 - 20) is OpenResult.OPENED
    assert rig.ledger.claim(after, 1, owner="w1", fence="f1", tool="refund").ok
    claim = rig.ledger.claim(before, 1, owner="w1", fence="f1", tool="refund")
    assert claim.kind is ClaimKind.FROZEN


def test_a_reopened_call_that_may_have_run_says_so(rig: Rig) -> None:
    frozen(rig)
    key = "s/t/c"
    write = snapshot(EffectClass.IDEMPOTENT_WRITE)
    assert rig.ledger.open(key, write, epoch=rig.epoch, may_have_run=True) is OpenResult.OPENED
    claim = rig.ledger.claim(key, 1, owner="w1", fence="f1", tool="refund")
    assert claim.kind is ClaimKind.FROZEN and claim.reached


def test_each_shard_holds_the_same_copy(rig: Rig) -> None:
    frozen(rig, "refund", "email")
    copies = rig.ledger.read_freezes()
    assert len(copies) == rig.keys.shards and len(set(copies)) == 1
    assert sorted(json.loads(copies[0] or "{}")) == ["email", "refund"]
