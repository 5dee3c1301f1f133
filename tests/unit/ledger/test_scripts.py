"""Every ledger script and every branch, on fakeredis (Lua) and on a real redis-server.

The ledger decides "this attempt reached a worker" (S3.3) and, atomically with the move that
ends an attempt, what happens to the call (S3.1, S3.2, S4.2, S4.3, S5.1, S5.2). Each test runs
twice: once on fakeredis, once on the session's private redis-server, so a difference between
the emulator's Lua and real Redis's Lua 5.1 shows up as a failing pair. A third run puts the
ledger on a real Redis Cluster (three primaries with a replica each) split into three shards, so
every script must touch keys of one slot only (Redis refuses a script across slots) and each
call's keys, indexes, stream and epoch live in its own shard (docs/redis.md, "Redis Cluster").
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from dex_celery.errors import LedgerError
from dex_celery.ledger.attempt_log import parse_attempt_log
from dex_celery.ledger.ledger import (
    Cause,
    ClaimKind,
    LoseMode,
    OpenResult,
    Step,
    StepKind,
)
from dex_celery.model.policy import EffectClass
from tests.support.stores.ledger_rig import (
    B0,
    BMAX,
    FINISHED_TTL,
    HB,
    S2C,
    S2S,
    T0,
    Rig,
    claimed,
    finished,
    opened,
    snapshot,
)
from tests.support.stores.ledger_rig import rig as rig

# --- open ------------------------------------------------------------------------------------


def test_open_creates_attempt_1_enqueued_with_its_deadline(rig: Rig) -> None:
    """S3.3, S3.5: attempt 1 waits in the queue index until its schedule-to-start deadline."""
    key = opened(rig, EffectClass.IDEMPOTENT_WRITE)
    h = rig.hash(key)
    assert h["status"] == "active"
    assert h["n"] == "1"
    assert h["state"] == "enqueued"
    assert h["effect"] == "idempotent_write"
    assert h["reached"] == "0"
    assert float(h["deadline"]) == T0 + S2S
    assert rig.indexes(key) == {"queue": T0 + S2S, "lease": None, "close": None, "unrecorded": None}
    assert rig.events("tool_call_requested") == [
        {"type": "tool_call_requested", "key": key, "effect": "idempotent_write"}
    ]


def test_open_twice_reports_exists_and_changes_nothing(rig: Rig) -> None:
    """S2.3: the same call is opened once; a second open neither resets it nor announces it."""
    key = opened(rig)
    rig.knobs.advance(3)
    before = rig.state(key)
    assert rig.ledger.open(key, snapshot(EffectClass.READ), epoch=rig.epoch) is OpenResult.EXISTS
    assert rig.state(key) == before


def test_open_without_announce_writes_no_event(rig: Rig) -> None:
    key = "s/t/quiet"
    result = rig.ledger.open(key, snapshot(EffectClass.READ), epoch=rig.epoch, announce=False)
    assert result is OpenResult.OPENED
    assert rig.events() == []


@pytest.mark.parametrize("stored", ["another-epoch", None])
def test_open_under_a_different_epoch_writes_nothing(rig: Rig, stored: str | None) -> None:
    """A ledger that is not the one the caller knows (Redis lost its data) opens nothing."""
    rig.client.delete(rig.keys.of("s/t/c").epoch)
    if stored is not None:
        rig.client.set(rig.keys.of("s/t/c").epoch, stored)
    result = rig.ledger.open("s/t/c", snapshot(EffectClass.READ), epoch=rig.epoch)
    assert result is OpenResult.EPOCH_CHANGED
    assert rig.hash("s/t/c") == {}
    assert rig.indexes("s/t/c")["queue"] is None
    assert rig.events() == []


def _single_redis(rig: Rig) -> None:
    if not rig.ledger.may_publish:
        pytest.skip("a clustered ledger publishes after its open (docs/ledger.md)")


def test_open_publishes_the_message_it_was_given_when_it_opens(rig: Rig) -> None:
    """The broker is this Redis: the open runs the message's commands in the same atomic step,
    after the entry is written (docs/ledger.md, "Opening a call")."""
    _single_redis(rig)
    sends = [("lpush", "q-opened", "message-1"), ("publish", "/0.celeryev/task.sent", "sent")]
    (result,) = rig.ledger.open_many(
        [("s/t/c", snapshot(EffectClass.READ))], epoch=rig.epoch, sends=[sends]
    )
    assert result is OpenResult.OPENED
    assert rig.hash("s/t/c")["state"] == "enqueued"
    assert rig.client.lrange("q-opened", 0, -1) == ["message-1"]


def test_open_that_finds_the_call_publishes_nothing(rig: Rig) -> None:
    """S2.3, S3.2: a call open already (or a ledger of another life) gets no second message."""
    _single_redis(rig)
    key = opened(rig)
    sends = [[("lpush", "q-exists", "again")]]
    call = [(key, snapshot(EffectClass.READ))]
    assert rig.ledger.open_many(call, epoch=rig.epoch, sends=sends) == [OpenResult.EXISTS]
    assert rig.ledger.open_many(call, epoch="other", sends=sends) == [OpenResult.EPOCH_CHANGED]
    assert rig.client.llen("q-exists") == 0


def test_open_refuses_a_command_that_is_not_a_publish_and_writes_nothing(rig: Rig) -> None:
    _single_redis(rig)
    with pytest.raises(LedgerError):
        rig.ledger.open_many(
            [("s/t/c", snapshot(EffectClass.READ))],
            epoch=rig.epoch,
            sends=[[("lpush", "q-refused", "m"), ("del", "q-refused", "x")]],
        )
    assert rig.hash("s/t/c") == {}
    assert rig.client.llen("q-refused") == 0
    assert rig.events() == []


def test_a_clustered_ledger_refuses_to_publish_in_its_open(rig: Rig) -> None:
    if rig.ledger.may_publish:
        pytest.skip("this ledger is one Redis")
    with pytest.raises(LedgerError):
        rig.ledger.open_many(
            [("s/t/c", snapshot(EffectClass.READ))],
            epoch=rig.epoch,
            sends=[[("lpush", "celery", "m")]],
        )


# --- claim -----------------------------------------------------------------------------------


def test_claim_records_that_the_attempt_reached_a_worker(rig: Rig) -> None:
    """S3.3: the claim moves enqueued -> running with owner, fence and lease, atomically."""
    key = opened(rig)
    rig.knobs.advance(2)
    now = rig.knobs.now
    claim = rig.ledger.claim(key, 1, owner="host:1", fence="fence-a")
    assert claim.ok
    assert (claim.heartbeat_timeout, claim.start_to_close) == (HB, S2C)
    h = rig.hash(key)
    assert (h["state"], h["owner"], h["fence"], h["reached"]) == (
        "running",
        "host:1",
        "fence-a",
        "1",
    )
    assert float(h["claimed_at"]) == now
    assert float(h["lease"]) == now + HB
    assert float(h["close"]) == now + S2C
    assert rig.indexes(key) == {
        "queue": None,
        "lease": now + HB,
        "close": now + S2C,
        "unrecorded": None,
    }
    assert rig.events("tool_call_started") == [
        {"type": "tool_call_started", "key": key, "attempt": "1", "owner": "host:1"}
    ]


def test_claim_at_exactly_the_deadline_is_still_in_time(rig: Rig) -> None:
    key = opened(rig)
    rig.knobs.advance(S2S)
    assert rig.ledger.claim(key, 1, owner="w", fence="f").ok


def test_claim_of_an_unknown_call_is_refused_and_creates_nothing(rig: Rig) -> None:
    """S3.3: no ledger entry, no run (a message whose call was never opened or already gone)."""
    claim = rig.ledger.claim("s/t/none", 1, owner="w", fence="f")
    assert (claim.ok, claim.reason) == (False, "unknown")
    assert rig.hash("s/t/none") == {}


def test_claim_refusals_and_the_refused_counter(rig: Rig) -> None:
    """S3.2, S3.3: a second worker, a stale attempt or a finished call never gets to run."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE, fence="first")
    second = rig.ledger.claim(key, 1, owner="w2", fence="second")
    assert (second.ok, second.reason) == (False, "already_running")
    stale = rig.ledger.claim(key, 2, owner="w2", fence="third")
    assert (stale.ok, stale.reason) == (False, "stale_attempt")
    h = rig.hash(key)
    assert (h["owner"], h["fence"]) == ("w1", "first")
    assert h["refused"] == "2"
    rig.ledger.finish(key, 1, fence="first", cause=Cause.OK, payload="1")
    done = rig.ledger.claim(key, 1, owner="w3", fence="fourth")
    assert (done.ok, done.reason) == (False, "finished")
    entry = rig.ledger.read(key)
    assert entry is not None and entry.refused == 3
    assert len(rig.events("tool_call_started")) == 1


def test_claim_after_the_schedule_to_start_deadline_is_refused(rig: Rig) -> None:
    """S3.5, S4.2: an attempt that waited too long does not run, even if a worker gets it."""
    key = opened(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    rig.knobs.advance(S2S + 0.001)
    claim = rig.ledger.claim(key, 1, owner="w", fence="f")
    assert (claim.ok, claim.reason) == (False, "expired")
    h = rig.hash(key)
    assert (h["state"], h["reached"], h["refused"]) == ("enqueued", "0", "1")


# --- heartbeat -------------------------------------------------------------------------------


def test_heartbeat_renews_the_lease_in_the_hash_and_the_index(rig: Rig) -> None:
    """S3.4: a live attempt's lease moves forward in both places the sweeper reads."""
    key = claimed(rig)
    now = rig.knobs.advance(4)
    assert rig.ledger.heartbeat([(key, "f1")]) == set()
    assert float(rig.hash(key)["lease"]) == now + HB
    assert rig.score(rig.keys.lease_index, key) == now + HB


def test_heartbeat_reports_fenced_attempts_and_renews_only_live_ones(rig: Rig) -> None:
    """S3.4, S5.1: a fenced attempt is told so; its lease is not renewed or re-indexed."""
    live = claimed(rig, key="s/t/live")
    wrong_fence = claimed(rig, key="s/t/other", fence="real")
    timed = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE, key="s/t/timed")
    rig.knobs.advance(S2C + 1)
    rig.ledger.time_out(timed, None, detail="d")
    now = rig.knobs.now
    fenced = rig.ledger.heartbeat(
        [(live, "f1"), (wrong_fence, "stolen"), (timed, "f1"), ("s/t/gone", "x")]
    )
    assert fenced == {wrong_fence, timed, "s/t/gone"}
    assert rig.score(rig.keys.lease_index, live) == now + HB
    assert rig.score(rig.keys.lease_index, wrong_fence) == T0 + HB
    assert rig.score(rig.keys.lease_index, timed) is None
    assert rig.score(rig.keys.lease_index, "s/t/gone") is None


def test_heartbeat_of_nothing_is_free(rig: Rig) -> None:
    assert rig.ledger.heartbeat([]) == set()


# --- finish ----------------------------------------------------------------------------------


def test_finish_ok_is_succeeded(rig: Rig) -> None:
    """S4.1: the tool returned -> succeeded; the outcome waits in the unrecorded index."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    now = rig.knobs.advance(7)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload='{"id": 7}')
    finished(step, "succeeded", "ok")
    assert not step.late_result
    assert _log_entries(step.log) == [(1, "succeeded", "w1", T0, now)]
    h = rig.hash(key)
    assert (h["status"], h["state"], h["fence"], h["result"]) == (
        "succeeded",
        "succeeded",
        "",
        '{"id": 7}',
    )
    assert rig.indexes(key) == {"queue": None, "lease": None, "close": None, "unrecorded": now}
    entry = rig.ledger.read(key)
    assert entry is not None
    assert [(e.attempt, e.state, e.owner, e.claimed_at, e.ended_at) for e in entry.log] == [
        (1, "succeeded", "w1", T0, now)
    ]


def _log_entries(text: str) -> list[tuple[int, str, str, float | None, float]]:
    """The attempt log a step carries (JSON, one codec: `attempt_log.py`)."""
    return [
        (e.attempt, e.state, e.owner, e.claimed_at, e.ended_at) for e in parse_attempt_log(text)
    ]


def test_finish_tool_error_is_failed_without_retry(rig: Rig) -> None:
    """S4.1: a failure the tool reports is `failed` with its message, even for a read."""
    key = claimed(rig, EffectClass.READ)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.TOOL_ERROR, payload="no such order")
    finished(step, "failed", "tool_error")
    assert step.detail == "no such order"
    assert rig.hash(key)["error"] == "no such order"


def test_finish_retryable_backs_off_exponentially_with_jitter_then_fails(rig: Rig) -> None:
    """S3.1: delay = min(backoff_max, backoff_initial * 2^(n-1)) * jitter, up to max attempts."""
    key = claimed(rig, EffectClass.READ, max_attempts=4)
    jitters = [0.5, 0.25, 0.9]
    for n, jitter in enumerate(jitters, start=1):
        rig.knobs.jitter = jitter
        now = rig.knobs.advance(1)
        step = rig.ledger.finish(key, n, fence=f"f{n}", cause=Cause.RETRYABLE, payload=f"blip {n}")
        expected = min(BMAX, B0 * 2 ** (n - 1)) * jitter
        assert step.kind is StepKind.RETRY
        assert step.attempt == n + 1
        assert step.delay == pytest.approx(expected)
        h = rig.hash(key)
        assert (h["n"], h["state"], h["owner"], h["fence"]) == (str(n + 1), "enqueued", "", "")
        assert (h["last_cause"], h["last_detail"]) == ("retryable", f"blip {n}")
        assert float(h["deadline"]) == pytest.approx(now + expected + S2S)
        indexes = rig.indexes(key)
        assert indexes["queue"] == pytest.approx(now + expected + S2S)
        assert (indexes["lease"], indexes["close"], indexes["unrecorded"]) == (None, None, None)
        # The retry waits out its backoff on the ledger's clock before it may claim.
        early = rig.ledger.claim(key, n + 1, owner="w", fence=f"f{n + 1}")
        assert (early.kind, early.wait) == (ClaimKind.EARLY, pytest.approx(expected))
        rig.knobs.advance(expected)
        assert rig.ledger.claim(key, n + 1, owner="w", fence=f"f{n + 1}").ok
    step = rig.ledger.finish(key, 4, fence="f4", cause=Cause.RETRYABLE, payload="still down")
    finished(step, "failed", "tool_error", attempt=4)
    assert step.detail == "still down"
    assert [e[1] for e in _log_entries(step.log)] == ["failed"] * 4


@pytest.mark.parametrize("effect", [EffectClass.NON_IDEMPOTENT_WRITE, EffectClass.UNCLASSIFIED])
def test_finish_retryable_of_a_single_attempt_class_fails_at_once(
    rig: Rig, effect: EffectClass
) -> None:
    """S3.2: a write that may repeat its effect gets exactly one attempt."""
    key = claimed(rig, effect)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.RETRYABLE, payload="timeout upstream")
    finished(step, "failed", "tool_error")


def test_finish_with_a_stale_fence_is_kept_as_a_late_result_only(rig: Rig) -> None:
    """S5.2: a fenced attempt's result never becomes the outcome; it is evidence and an event."""
    key = claimed(rig, fence="current")
    before = rig.hash(key)
    step = rig.ledger.finish(key, 1, fence="old", cause=Cause.OK, payload='"old value"')
    assert step.kind is StepKind.LATE
    after = rig.hash(key)
    late = json.loads(after.pop("late"))
    assert after == before
    assert late == {"attempt": 1, "cause": "ok", "payload": '"old value"', "at": T0}
    assert rig.events("tool_call_late_result") == [
        {"type": "tool_call_late_result", "key": key, "attempt": "1", "cause": "ok"}
    ]
    finished(
        rig.ledger.finish(key, 1, fence="current", cause=Cause.OK, payload="1"), "succeeded", "ok"
    )


def test_finish_of_an_attempt_fenced_by_time_out_leaves_the_outcome_alone(rig: Rig) -> None:
    """S5.1, S5.2: the old worker finishing later does not overwrite the timed-out record."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    rig.knobs.advance(S2C + 1)
    finished(rig.ledger.time_out(key, None, detail="fenced"), "failed", "timed_out")
    before = rig.hash(key)
    rig.knobs.advance(30)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload='"done anyway"')
    assert step.kind is StepKind.LATE
    after = rig.hash(key)
    assert json.loads(after.pop("late"))["payload"] == '"done anyway"'
    assert after == before
    assert (after["status"], after["reason"]) == ("failed", "timed_out")
    assert "result" not in after
    assert len(rig.events("tool_call_late_result")) == 1


def test_finish_after_the_close_deadline_counts_as_timed_out(rig: Rig) -> None:
    """S5.1, S5.2: finished past start-to-close but before the sweeper fenced it."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    rig.knobs.advance(S2C + 0.5)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload='"too late"')
    finished(step, "failed", "timed_out")
    assert step.late_result
    assert step.detail == "the tool finished after its start-to-close deadline"
    h = rig.hash(key)
    assert json.loads(h["late"])["payload"] == '"too late"'
    assert "result" not in h
    assert h["state"] == "timed_out"
    assert len(rig.events("tool_call_late_result")) == 1


def test_finish_after_the_close_deadline_of_a_read_retries_with_the_marker(rig: Rig) -> None:
    """S3.1, S5.1: a timed-out read with attempts left gets another attempt; result is evidence."""
    key = claimed(rig, EffectClass.READ)
    rig.knobs.advance(S2C + 0.5)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload='"x"')
    assert (step.kind, step.attempt, step.late_result) == (StepKind.RETRY, 2, True)


def test_finish_with_timed_out_cause_of_the_soft_limit(rig: Rig) -> None:
    """S5.1: the soft time limit fired inside the tool: failed, timed_out, no late marker."""
    key = claimed(rig, EffectClass.UNCLASSIFIED)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.TIMED_OUT, payload="soft limit")
    finished(step, "failed", "timed_out")
    assert not step.late_result


# --- lose ------------------------------------------------------------------------------------


def test_lose_lapsed_only_when_the_lease_really_passed(rig: Rig) -> None:
    """S3.4, S4.3: the sweeper's view may be stale; a renewed lease is not lost."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    rig.knobs.advance(HB - 1)
    rig.ledger.heartbeat([(key, "f1")])
    rig.knobs.advance(HB - 1)  # past the first lease, not the renewed one
    before = rig.state(key)
    assert rig.ledger.lose(key, None, mode=LoseMode.LAPSED, detail="lapsed").kind is StepKind.NOOP
    assert rig.state(key) == before
    rig.knobs.advance(1.5)
    step = rig.ledger.lose(key, None, mode=LoseMode.LAPSED, detail="its lease lapsed")
    finished(step, "outcome_unknown", "lost")
    assert rig.hash(key)["state"] == "lost"


def test_lose_worker_lost_while_running_is_lost_at_once(rig: Rig) -> None:
    """S4.3: a dead pool child after the claim may have run the tool, lease or not."""
    key = claimed(rig, EffectClass.UNCLASSIFIED)
    step = rig.ledger.lose(key, 1, mode=LoseMode.WORKER_LOST, owner="w1", detail="SIGKILL")
    finished(step, "outcome_unknown", "lost")
    assert step.detail == "SIGKILL"
    assert [e[1] for e in _log_entries(step.log)] == ["lost"]


def test_lose_worker_lost_before_the_claim_did_not_run(rig: Rig) -> None:
    """S4.2: the child died before claiming: the tool provably did not run."""
    key = opened(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    step = rig.ledger.lose(key, 1, mode=LoseMode.WORKER_LOST, owner="w1", detail="died early")
    finished(step, "failed", "did_not_run")
    h = rig.hash(key)
    assert (h["state"], h["reached"]) == ("expired", "0")
    assert rig.indexes(key)["queue"] is None


def test_lose_lapsed_of_an_enqueued_attempt_does_nothing(rig: Rig) -> None:
    key = opened(rig)
    rig.knobs.advance(S2S * 5)
    before = rig.state(key)
    assert rig.ledger.lose(key, None, mode=LoseMode.LAPSED, detail="x").kind is StepKind.NOOP
    assert rig.state(key) == before


def test_lose_of_another_attempt_or_an_unknown_call_does_nothing(rig: Rig) -> None:
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    before = rig.state(key)
    assert (
        rig.ledger.lose(key, 2, mode=LoseMode.WORKER_LOST, owner="w1", detail="x").kind
        is StepKind.NOOP
    )
    assert (
        rig.ledger.lose("s/t/none", None, mode=LoseMode.WORKER_LOST, owner="w1", detail="x").kind
        is StepKind.NOOP
    )
    assert rig.state(key) == before
    assert rig.hash("s/t/none") == {}


# --- expire ----------------------------------------------------------------------------------


def test_expire_due_only_after_the_deadline(rig: Rig) -> None:
    """S4.2: never claimed by its schedule-to-start deadline -> did not run."""
    key = opened(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    rig.knobs.advance(S2S - 1)
    assert rig.ledger.expire(key, None, unpublished=False, detail="d").kind is StepKind.NOOP
    assert rig.hash(key)["state"] == "enqueued"
    now = rig.knobs.advance(2)
    step = rig.ledger.expire(key, None, unpublished=False, detail="nobody claimed it")
    finished(step, "failed", "did_not_run")
    assert step.detail == "nobody claimed it"
    assert rig.indexes(key) == {"queue": None, "lease": None, "close": None, "unrecorded": now}


def test_expire_unpublished_ends_the_attempt_before_its_deadline(rig: Rig) -> None:
    """S4.2: the broker refused the message, so no worker can ever claim it."""
    key = opened(rig, EffectClass.UNCLASSIFIED)
    step = rig.ledger.expire(key, 1, unpublished=True, detail="broker down")
    finished(step, "failed", "did_not_run")


def test_expire_of_a_running_attempt_does_nothing(rig: Rig) -> None:
    key = claimed(rig)
    rig.knobs.advance(S2S * 3)
    before = rig.state(key)
    assert rig.ledger.expire(key, None, unpublished=True, detail="x").kind is StepKind.NOOP
    assert rig.state(key) == before


def test_expire_retries_a_read_that_never_reached_a_worker(rig: Rig) -> None:
    """S3.1: a read whose attempt expired is retried with backoff."""
    key = opened(rig, EffectClass.READ)
    rig.knobs.advance(S2S + 1)
    step = rig.ledger.expire(key, None, unpublished=False, detail="d")
    assert (step.kind, step.attempt) == (StepKind.RETRY, 2)
    assert step.delay == pytest.approx(B0 * 0.5)


# --- note (a worker without the tool hands the attempt back; docs/reliability.md) -----------


def test_note_says_why_an_enqueued_attempt_waits_and_joins_its_did_not_run_text(
    rig: Rig,
) -> None:
    """Version skew: the note is kept on the waiting attempt only, and a deadline that passes
    before any capable worker comes ends the call "did not run" with it (S4.2)."""
    key = opened(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    assert rig.ledger.note_waiting(key, 1, "no running worker has this tool yet") is True
    entry = rig.ledger.read(key)
    assert entry is not None and entry.waiting == "no running worker has this tool yet"
    assert rig.ledger.note_waiting(key, 2, "stale attempt") is False  # not the current one
    rig.knobs.advance(S2S + 1)
    step = rig.ledger.expire(key, None, unpublished=False, detail="nobody claimed it")
    finished(step, "failed", "did_not_run")
    assert step.detail == "nobody claimed it; no running worker has this tool yet"
    assert rig.ledger.note_waiting(key, 1, "again") is False  # ended: its message is stale


def test_note_is_refused_once_the_attempt_is_claimed(rig: Rig) -> None:
    key = claimed(rig)
    before = rig.state(key)
    assert rig.ledger.note_waiting(key, 1, "no running worker has this tool yet") is False
    assert rig.state(key) == before


@pytest.mark.parametrize(
    ("effect", "status", "reason"),
    [
        (EffectClass.READ, "failed", "lost"),
        (EffectClass.IDEMPOTENT_WRITE, "outcome_unknown", "lost"),
    ],
)
def test_reopened_after_data_loss_never_ends_as_did_not_run(
    rig: Rig, effect: EffectClass, status: str, reason: str
) -> None:
    """S4.2, S4.3: a call reopened after Redis lost its data may have run in the lost ledger, so
    running out of attempts that never reached a worker is not "the tool did not run"."""
    key = "s/t/lost"
    opened_ = rig.ledger.open(key, snapshot(effect, 1), epoch=rig.epoch, may_have_run=True)
    assert opened_ is OpenResult.OPENED
    assert rig.hash(key)["reached"] == "1"
    rig.knobs.advance(S2S + 1)
    finished(rig.ledger.expire(key, None, unpublished=False, detail="d"), status, reason)


# --- time_out --------------------------------------------------------------------------------


def test_time_out_only_after_the_close_deadline_and_fences(rig: Rig) -> None:
    """S5.1: past start-to-close the attempt is fenced and the failure recorded."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    rig.knobs.advance(S2C - 1)
    assert rig.ledger.time_out(key, None, detail="d").kind is StepKind.NOOP
    assert rig.hash(key)["state"] == "running"
    rig.knobs.advance(2)
    step = rig.ledger.time_out(key, None, detail="fenced by the sweeper")
    finished(step, "failed", "timed_out")
    h = rig.hash(key)
    assert (h["state"], h["fence"]) == ("timed_out", "")
    assert rig.ledger.heartbeat([(key, "f1")]) == {key}


def test_time_out_starts_the_fenced_attempts_running_lease(rig: Rig) -> None:
    """S5.1, S5.4: in the same step that fences it, the timed-out attempt gets a running lease of
    one heartbeat timeout (the repeat guard's "may still be running"); a refused time-out sets
    none. The worker renews it (`hold_running`, only while it exists) and drops it on return."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    rig.ledger.time_out(key, None, detail="too early")
    assert not rig.ledger.still_running(key)
    rig.knobs.advance(S2C + 1)
    finished(rig.ledger.time_out(key, None, detail="d"), "failed", "timed_out")
    assert rig.ledger.still_running(key)
    ttl = int(rig.client.pttl(rig.keys.running(key)))
    assert 0 < ttl <= HB * 1000
    rig.ledger.hold_running([(key, 60.0)])
    assert int(rig.client.pttl(rig.keys.running(key))) > HB * 1000
    rig.ledger.release_running(key)
    assert not rig.ledger.still_running(key)
    rig.ledger.hold_running([(key, 60.0)])  # never recreated once gone
    assert not rig.ledger.still_running(key)


def test_time_out_of_a_read_with_attempts_left_retries(rig: Rig) -> None:
    key = claimed(rig, EffectClass.READ)
    rig.knobs.advance(S2C + 1)
    assert rig.ledger.time_out(key, 1, detail="d").kind is StepKind.RETRY


def test_time_out_of_an_enqueued_attempt_does_nothing(rig: Rig) -> None:
    key = opened(rig)
    rig.knobs.advance(S2C * 2)
    assert rig.ledger.time_out(key, None, detail="d").kind is StepKind.NOOP


# --- recorded --------------------------------------------------------------------------------


def test_position_and_read_tells_which_decided_outcomes_are_not_yet_recorded(rig: Rig) -> None:
    """A caller's `wait` learns, with the events' position, whose `tool_call_finished` is still
    to come after it (docs/ledger.md, "Recording outcomes")."""
    key = claimed(rig)
    position, entries, unrecorded = rig.ledger.position_and_read([key, "s/t/none"])
    assert entries["s/t/none"] is None
    entry = entries[key]
    assert entry is not None and entry.status == "active"
    assert unrecorded == set()
    rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload="1")
    position, entries, unrecorded = rig.ledger.position_and_read([key])
    if rig.ledger.may_publish:  # one Redis: known in the same round trip
        assert unrecorded == {key}
    assert rig.ledger.recorded(key, status="succeeded", error="")
    later = rig.ledger.events.read(position)
    assert [e.type for e in later] == ["tool_call_finished"]
    _position, _entries, unrecorded = rig.ledger.position_and_read([key])
    assert unrecorded == set()


def test_recorded_announces_once_and_lets_the_entry_expire(rig: Rig) -> None:
    """S7.3: exactly one tool_call_finished event per call, however many writers race."""
    key = claimed(rig)
    assert not rig.ledger.recorded(key, status="succeeded", error="")  # not decided yet
    assert rig.client.ttl(rig.keys.call(key)) == -1
    rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload="1")
    assert rig.ledger.recorded(key, status="succeeded", error="")
    assert not rig.ledger.recorded(key, status="succeeded", error="")
    assert rig.events("tool_call_finished") == [
        {"type": "tool_call_finished", "key": key, "status": "succeeded", "error": ""}
    ]
    ttl = rig.client.ttl(rig.keys.call(key))
    assert 0 < ttl <= FINISHED_TTL
    assert rig.indexes(key)["unrecorded"] is None


# --- the outcome table of _common.lua (next_step) ------------------------------------------

LOST_OUTCOME = {
    EffectClass.READ: ("failed", "lost"),
    EffectClass.IDEMPOTENT_WRITE: ("outcome_unknown", "lost"),
    EffectClass.NON_IDEMPOTENT_WRITE: ("outcome_unknown", "lost"),
    EffectClass.UNCLASSIFIED: ("outcome_unknown", "lost"),
}


@pytest.mark.parametrize("effect", list(EffectClass))
def test_lost_after_the_last_attempt(rig: Rig, effect: EffectClass) -> None:
    """S4.3: out of attempts, a lost read is failed; any other lost call is outcome_unknown."""
    key = claimed(rig, effect, max_attempts=1)
    step = rig.ledger.lose(key, None, mode=LoseMode.WORKER_LOST, owner="w1", detail="killed")
    finished(step, *LOST_OUTCOME[effect])


@pytest.mark.parametrize("effect", list(EffectClass))
def test_lost_with_attempts_left(rig: Rig, effect: EffectClass) -> None:
    """S3.1, S3.2: reads and idempotent writes are retried; the other classes never are."""
    key = claimed(rig, effect)
    step = rig.ledger.lose(key, None, mode=LoseMode.WORKER_LOST, owner="w1", detail="killed")
    if effect.retryable:
        assert (step.kind, step.attempt) == (StepKind.RETRY, 2)
        assert rig.hash(key)["reached"] == "1"
    else:
        finished(step, *LOST_OUTCOME[effect])


@pytest.mark.parametrize("effect", list(EffectClass))
def test_never_reached_is_failed_did_not_run(rig: Rig, effect: EffectClass) -> None:
    """S4.2: every attempt failed before reaching a worker -> failed, did not run."""
    key = opened(rig, effect)
    step: Step | None = None
    for n in range(1, (3 if effect.retryable else 1) + 1):
        rig.knobs.advance(1000)
        step = rig.ledger.expire(key, n, unpublished=False, detail="no worker")
        if n < (3 if effect.retryable else 1):
            assert (step.kind, step.attempt) == (StepKind.RETRY, n + 1)
    assert step is not None
    finished(step, "failed", "did_not_run", attempt=3 if effect.retryable else 1)
    assert [e[1] for e in _log_entries(step.log)] == ["expired"] * step.attempt


@pytest.mark.parametrize("effect", [EffectClass.READ, EffectClass.IDEMPOTENT_WRITE])
def test_reached_once_then_expired_counts_as_lost(rig: Rig, effect: EffectClass) -> None:
    """S4.3: once any attempt reached a worker the tool may have run, whatever came after."""
    key = claimed(rig, effect, max_attempts=2)
    rig.knobs.advance(HB + 1)
    assert rig.ledger.lose(key, None, mode=LoseMode.LAPSED, detail="lapsed").kind is StepKind.RETRY
    rig.knobs.advance(1000)
    step = rig.ledger.expire(key, 2, unpublished=False, detail="no worker for attempt 2")
    finished(step, *LOST_OUTCOME[effect], attempt=2)
    assert [e[1] for e in _log_entries(step.log)] == ["lost", "expired"]


# --- compare-and-set --------------------------------------------------------------------------


def test_a_second_identical_transition_is_a_noop(rig: Rig) -> None:
    """S3.2, S4.1: two sweepers (or a sweeper and the fast path) move an attempt once."""
    lost = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE, key="s/t/lost")
    expired = opened(rig, EffectClass.NON_IDEMPOTENT_WRITE, key="s/t/expired")
    timed = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE, key="s/t/timed")
    rig.knobs.advance(S2C + 1)
    moves: dict[str, Callable[[], Step]] = {
        lost: lambda: rig.ledger.lose(lost, 1, mode=LoseMode.LAPSED, detail="d"),
        expired: lambda: rig.ledger.expire(expired, 1, unpublished=False, detail="d"),
        timed: lambda: rig.ledger.time_out(timed, 1, detail="d"),
    }
    for key, move in moves.items():
        assert move().kind is StepKind.FINISHED
        before = rig.state(key)
        assert move().kind is StepKind.NOOP
        assert (
            rig.ledger.lose(key, None, mode=LoseMode.WORKER_LOST, owner="w1", detail="d").kind
            is StepKind.NOOP
        )
        assert rig.ledger.expire(key, None, unpublished=True, detail="d").kind is StepKind.NOOP
        assert rig.ledger.time_out(key, None, detail="d").kind is StepKind.NOOP
        assert rig.state(key) == before


def test_a_repeated_finish_of_the_same_attempt_is_a_noop(rig: Rig) -> None:
    """S4.1, S5.2: redis-py retries a command whose reply was lost; the repeat of a finish that
    was applied is neither a second outcome nor a (false) late result."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    finished(rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload="1"), "succeeded", "ok")
    before = rig.state(key)
    step = rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload="1")
    assert step.kind is StepKind.NOOP
    assert rig.state(key) == before
    assert "late" not in rig.hash(key)
    assert rig.events("tool_call_late_result") == []


def test_a_repeated_finish_after_a_retry_is_a_noop(rig: Rig) -> None:
    """S3.1: the repeat of a finish that opened attempt 2 does not touch attempt 2."""
    key = claimed(rig, EffectClass.READ)
    assert rig.ledger.finish(key, 1, fence="f1", cause=Cause.RETRYABLE, payload="x").kind is (
        StepKind.RETRY
    )
    before = rig.state(key)
    assert rig.ledger.finish(key, 1, fence="f1", cause=Cause.RETRYABLE, payload="x").kind is (
        StepKind.NOOP
    )
    assert rig.state(key) == before


def test_a_repeated_claim_by_the_same_worker_still_holds(rig: Rig) -> None:
    """S3.3: a claim repeated after a lost reply (same attempt, same fence) is the same claim:
    the worker may run the tool; nothing is counted as refused and nothing is announced twice."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE, fence="mine")
    before = rig.state(key)
    rig.knobs.advance(S2S + 1)  # even once the queue deadline has passed
    again = rig.ledger.claim(key, 1, owner="w1", fence="mine")
    assert (again.ok, again.heartbeat_timeout, again.start_to_close) == (True, HB, S2C)
    assert rig.state(key) == before
    assert "refused" not in rig.hash(key)


def test_a_second_finish_by_another_fence_never_changes_the_outcome(rig: Rig) -> None:
    """S4.1, S5.2: the first finish decides; another fence's finish is evidence only."""
    key = claimed(rig, EffectClass.NON_IDEMPOTENT_WRITE)
    finished(rig.ledger.finish(key, 1, fence="f1", cause=Cause.OK, payload="1"), "succeeded", "ok")
    step = rig.ledger.finish(key, 1, fence="other", cause=Cause.TOOL_ERROR, payload="boom")
    assert step.kind is StepKind.LATE
    h = rig.hash(key)
    assert (h["status"], h["result"], h["error"]) == ("succeeded", "1", "")


# --- reads -----------------------------------------------------------------------------------


def test_due_reads_only_items_whose_deadline_passed_oldest_first(rig: Rig) -> None:
    """docs/ledger.md, "Sweeps": a scan costs the number of due items, in deadline order, with a limit."""
    shard = rig.keys.shard_of("s/t/c0")
    # Keys of one shard (all of them on a single shard): a due-index is per shard.
    keys = [k for k in (f"s/t/c{i}" for i in range(100)) if rig.keys.shard_of(k) == shard][:5]
    for key in keys:
        opened(rig, key=key)
        rig.knobs.advance(1)
    index = rig.keys.shard(shard).queue_index
    assert rig.ledger.due(index, now=T0 + S2S + 2) == keys[:3]
    assert rig.ledger.due(index, now=T0 + S2S + 10, limit=2) == keys[:2]
    assert rig.ledger.live([keys[0], "s/t/none"]) == {keys[0]: True, "s/t/none": False}


def test_full_sequence_matches_between_backends(rig: Rig) -> None:
    """S3.1, S3.3, S4.3, S7.3: open, claim, heartbeat, lose, retry, claim, finish, recorded.

    Runs identically on fakeredis and real Redis; the reply shapes and numbers must agree.
    """
    key = claimed(rig, EffectClass.IDEMPOTENT_WRITE)
    rig.knobs.advance(2)
    assert rig.ledger.heartbeat([(key, "f1")]) == set()
    rig.knobs.advance(HB + 0.5)
    step = rig.ledger.lose(key, None, mode=LoseMode.LAPSED, detail="lapsed")
    assert (step.kind, step.attempt, step.delay) == (StepKind.RETRY, 2, 0.5)
    assert not rig.ledger.claim(key, 1, owner="w", fence="x").ok
    rig.knobs.advance(0.5)
    assert rig.ledger.claim(key, 2, owner="w2", fence="f2").ok
    step = rig.ledger.finish(key, 2, fence="f2", cause=Cause.OK, payload='{"ok": true}')
    finished(step, "succeeded", "ok", attempt=2)
    assert [e[:3] for e in _log_entries(step.log)] == [(1, "lost", "w1"), (2, "succeeded", "w2")]
    assert rig.ledger.recorded(key, status="succeeded", error="")
    types = [e["type"] for e in rig.events()]
    assert types == [
        "tool_call_requested",
        "tool_call_started",
        "tool_call_started",
        "tool_call_ended",
        "tool_call_finished",
    ]
    entry = rig.ledger.read(key)
    assert entry is not None
    assert (entry.status, entry.attempt, entry.reached, entry.result) == (
        "succeeded",
        2,
        True,
        '{"ok": true}',
    )


def test_batched_runs_survive_a_flushed_script_cache(rig: Rig) -> None:
    """A Redis restart empties the script cache: a pipelined batch loads the script and runs
    each transition exactly once (an open reported twice would leave a call unpublished)."""
    rig.client.script_flush()
    calls = [("s/t/a", snapshot(EffectClass.READ)), ("s/t/b", snapshot(EffectClass.READ))]
    assert rig.ledger.open_many(calls, epoch=rig.epoch) == [OpenResult.OPENED, OpenResult.OPENED]
    assert rig.ledger.open_many(calls, epoch=rig.epoch) == [OpenResult.EXISTS, OpenResult.EXISTS]
    assert len(rig.events("tool_call_requested")) == 2
