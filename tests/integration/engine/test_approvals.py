"""Approvals (S1.3, S1.5, S6) against a real redis-server, real prefork workers, and both SQLite
and the running PostgreSQL (each test runs once per database; PostgreSQL in a private schema)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pytest
from celery import Celery

from devtools.processes import Worker, wait_for
from devtools.toolapp import executions, make_app
from dex_celery import (
    AlreadyDecided,
    ApprovalDeadlinePassed,
    AsyncDexClient,
    CallStatus,
    Dex,
    EffectClass,
    InvalidDecision,
    InvalidId,
    MessageRole,
    NotAwaitingApproval,
    Settings,
    ToolCallRecord,
    ToolContext,
    ToolPolicy,
    UnknownCall,
)
from dex_celery.engine.request.approvals import APPROVAL_EXPIRED_BY
from dex_celery.engine.request.opening import Opener
from tests.support.faults.crash import count_calls
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [
    pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning"),
    ON_BOTH_DATABASES,
]


# --- helpers ---------------------------------------------------------------------------------


def _noop(ctx: ToolContext, **arguments: Any) -> Any:
    return "ok"


def events(dex: Dex, key: str) -> list[dict[str, str]]:
    entries: Any = dex.ledger.client.xrange(dex.keys.events)
    return [fields for _id, fields in entries if fields.get("key") == key]


def broker_messages(dex: Dex) -> int:
    """Celery messages waiting in the broker (the Redis transport's queue lists)."""
    client = dex.ledger.client
    return sum(int(client.llen(k)) for k in client.keys("celery*") if client.type(k) == "list")


def tool_messages(dex: Dex, session_id: str, key: str) -> list[str]:
    snapshot = dex.client().get_agent_snapshot(session_id)
    turn, call = key.split("/")[1:]
    return [
        m.tool_output or ""
        for m in snapshot.messages
        if m.role is MessageRole.TOOL and m.turn_id == turn and m.tool_call_id == call
    ]


def state(dex: Dex, key: str) -> tuple[Any, ...]:
    """Everything a refused decision must leave unchanged (S6.3)."""
    record = dex.store.get_call(key)
    session = key.split("/")[0]
    history = dex.client().get_agent_snapshot(session).messages if record else ()
    raw: Any = dex.ledger.client.hgetall(dex.keys.call(key))
    return record, history, raw, len(events(dex, key)), count_calls(dex)


def _past(moment: float) -> bool:
    return time.time() > moment


def race(actions: Sequence[Callable[[], ToolCallRecord]]) -> list[ToolCallRecord | Exception]:
    """Run `actions` in threads released at the same instant by a barrier."""
    barrier = threading.Barrier(len(actions))
    out: list[ToolCallRecord | Exception | None] = [None] * len(actions)

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            out[i] = actions[i]()
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(actions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None for r in out), out
    return [r for r in out if r is not None]


def starts(key: str) -> list[str]:
    return [line for line in executions(key) if line.startswith("start")]


# --- S1.3: who asks ----------------------------------------------------------------------------


def test_default_approval_table_of_s1_3(dex: Dex) -> None:
    """S1.3 default table, S6.1: read and idempotent_write run unasked; non_idempotent_write and
    unclassified (declared, or no policy at all) wait with a deadline, and while waiting they hold
    no ledger entry and no Celery message."""
    rows = [
        ("t_read", ToolPolicy(effect=EffectClass.READ), EffectClass.READ, False),
        (
            "t_idem",
            ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE),
            EffectClass.IDEMPOTENT_WRITE,
            False,
        ),
        (
            "t_write",
            ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE),
            EffectClass.NON_IDEMPOTENT_WRITE,
            True,
        ),
        (
            "t_unclassified",
            ToolPolicy(effect=EffectClass.UNCLASSIFIED),
            EffectClass.UNCLASSIFIED,
            True,
        ),
        ("t_no_policy", None, EffectClass.UNCLASSIFIED, True),
    ]
    client = dex.client()
    for i, (name, policy, effect, asks) in enumerate(rows):
        dex.tool(name, policy=policy)(_noop)
        queued_before = broker_messages(dex)
        record = client.request_call("s1", "t1", f"c{i}", name, {"n": i})
        assert record.effect is effect, name
        assert record.policy.requires_approval is asks, name
        if asks:
            assert record.status is CallStatus.AWAITING_APPROVAL, name
            assert record.approval_deadline == pytest.approx(
                record.requested_at + dex.settings.approval_timeout
            )
            assert dex.ledger.read(record.key) is None, f"{name} holds a ledger entry"
            assert broker_messages(dex) == queued_before, f"{name} was published"
            kinds = [e["type"] for e in events(dex, record.key)]
            assert kinds == ["tool_call_requested", "tool_call_awaiting_approval"], name
        else:
            assert record.status is CallStatus.PENDING, name
            assert record.approval_deadline is None, name
            assert dex.ledger.read(record.key) is not None, name
            assert broker_messages(dex) == queued_before + 1, name
    listed = [p.key for p in client.pending_approvals()]
    assert listed == ["s1/t1/c2", "s1/t1/c3", "s1/t1/c4"]


def test_requires_approval_true_asks_even_for_a_read(dex: Dex) -> None:
    """S1.3 override: requires_approval=True asks before every call, whatever the class; the
    approved read then gets the read's retries (S3.1)."""
    dex.tool("lookup", policy=ToolPolicy(effect=EffectClass.READ, requires_approval=True))(_noop)
    client = dex.client()
    record = client.request_call("s1", "t1", "c1", "lookup", {})
    assert record.status is CallStatus.AWAITING_APPROVAL
    assert dex.ledger.read(record.key) is None
    approved = client.approve(record.key, "alice")
    assert approved.status is CallStatus.PENDING
    raw: Any = dex.ledger.client.hgetall(dex.keys.call(record.key))
    assert raw["effect"] == "read" and int(raw["max"]) == dex.settings.max_attempts


def test_requires_approval_false_runs_a_write_unasked_and_at_most_once(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """S1.3 override: requires_approval=False lets a non_idempotent_write run without asking;
    it still gets exactly one attempt (S3.2); its task is acknowledged late, as every tool's
    (docs/ledger.md, "Celery options"), its claim being what keeps it to one run."""
    start_worker()
    client = dex.client()
    name = "slow_non_idempotent_write"
    record = client.request_call("s1", "t1", "c1", name, {"seconds": 0, "value": "paid"})
    assert record.status is CallStatus.PENDING
    assert record.policy.requires_approval is False
    assert record.policy.max_attempts == 1
    assert dex.celery.tasks[f"dex.tool.{name}"].acks_late is True
    (done,) = client.wait([record.key], timeout=45)
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert done.attempts == 1 and done.approval is None
    assert len(starts(record.key)) == 1


# --- S1.5 / S6.2: the snapshot rules ---------------------------------------------------------


def test_policy_change_between_request_and_approval_runs_under_the_snapshot(
    dex: Dex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1.5, S6.2: the call was requested as a single-attempt write with a 7 s start-to-close and
    a secret argument; the tool is then redeployed as a retried read with other limits. The
    approved call is opened and published under the recorded snapshot; only new calls see the
    new policy."""
    old = ToolPolicy(
        effect=EffectClass.NON_IDEMPOTENT_WRITE, start_to_close=7.0, secret_arguments=("card",)
    )
    dex.tool("refund", policy=old)(_noop)
    record = dex.client().request_call("s1", "t1", "c1", "refund", {"order": 1, "card": "4111"})
    assert record.status is CallStatus.AWAITING_APPROVAL

    # A fresh deployment of the same tool under a different policy.
    redeployed = Dex(Celery("redeployed"), dex.settings)
    new = ToolPolicy(
        effect=EffectClass.READ, requires_approval=False, max_attempts=5, start_to_close=99.0
    )
    redeployed.tool("refund", policy=new)(_noop)
    sent: list[dict[str, Any]] = []
    real_send = redeployed.celery.send_task

    def spy(name: str, *args: Any, **kwargs: Any) -> Any:
        sent.append({"name": name, **kwargs})
        return real_send(name, *args, **kwargs)

    monkeypatch.setattr(redeployed.celery, "send_task", spy)

    approved = redeployed.client().approve(record.key, "alice", "customer called")
    assert approved.policy == record.policy
    assert approved.approval is not None and approved.approval.decided_by == "alice"
    raw: Any = redeployed.ledger.client.hgetall(redeployed.keys.call(record.key))
    assert raw["effect"] == "non_idempotent_write"
    assert int(raw["max"]) == 1
    assert float(raw["s2c"]) == 7.0
    (message,) = sent
    assert message["task_id"] == f"{record.key}#1"
    assert message["soft_time_limit"] == 7.0
    assert "4111" not in message["kwargsrepr"] and "***" in message["kwargsrepr"]

    later = redeployed.client().request_call("s1", "t2", "c1", "refund", {"order": 2})
    assert later.status is CallStatus.PENDING and later.effect is EffectClass.READ


# --- S6.1 / S6.3: one decision wins ------------------------------------------------------------


def test_concurrent_decisions_one_wins_and_the_tool_runs_once(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """S6.1, S6.3: two people decide the same call at the same instant, from two deployments'
    clients (own engines, own Redis connections) against the real database. Exactly one
    decision is recorded, the other gets `AlreadyDecided` naming the winner, and an approved
    call runs exactly once (counted by the tool's own log); a rejected one never runs."""
    start_worker()
    first = make_app(Settings.from_env(env))[1].client()
    second = make_app(Settings.from_env(env))[1].client()
    plans = ["approve", "approve", "approve", "approve", "reject"]
    keys = []
    for i, plan in enumerate(plans):
        record = dex.client().request_call("s1", f"t{i}", "c1", "guarded_write", {"value": i})
        assert record.status is CallStatus.AWAITING_APPROVAL
        keys.append(record.key)
        key = record.key
        other = (
            partial(second.approve, key, "bob")
            if plan == "approve"
            else partial(second.reject, key, "bob", "not today")
        )
        results = race([partial(first.approve, key, "alice"), other])
        wins = [r for r in results if not isinstance(r, Exception)]
        losses = [r for r in results if isinstance(r, Exception)]
        assert len(wins) == 1 and len(losses) == 1, results
        (loss,) = losses
        assert isinstance(loss, AlreadyDecided), repr(loss)
        winner = dex.store.get_call(key)
        assert winner is not None and winner.approval is not None
        assert loss.decided_by == winner.approval.decided_by
        assert loss.decision == winner.approval.decision
        decided = [e for e in events(dex, key) if e["type"] == "tool_call_decided"]
        assert len(decided) == 1 and decided[0]["by"] == winner.approval.decided_by

    done = dex.client().wait(keys, timeout=60)
    for record in done:
        assert record.approval is not None
        if record.approval.decision == "approved":
            assert record.status is CallStatus.SUCCEEDED, record.error
            assert len(starts(record.key)) == 1, executions(record.key)
        else:
            assert record.status is CallStatus.REJECTED
            assert record.error == "rejected by bob: not today"
            assert starts(record.key) == []
            (output,) = tool_messages(dex, record.session_id, record.key)
            assert "rejected" in output and "not today" in output


# --- S6.2: deadline ----------------------------------------------------------------------------


def test_deadline_expiry_by_the_sweeper_rejects_and_never_runs(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """S6.2, S4.1: nobody decides before the 1 s approval deadline; the sweeper ends the call
    `rejected`, the tool never runs although a worker is up, and the model reads that the
    deadline passed. A decision arriving afterwards gets `ApprovalDeadlinePassed` (S6.3)."""
    start_worker()
    client = dex.client()
    record = client.request_call("s1", "t1", "c1", "guarded_write_short", {"value": 5})
    assert record.status is CallStatus.AWAITING_APPROVAL
    assert record.approval_deadline == pytest.approx(record.requested_at + 1.0)
    wait_for(
        lambda: client.get_call(record.key).status is CallStatus.REJECTED,
        timeout=30,
        what="the sweeper to reject the call at its deadline",
    )
    done = client.get_call(record.key)
    assert done.approval is not None
    assert done.approval.decision == "expired"
    assert done.approval.decided_by == APPROVAL_EXPIRED_BY
    assert done.approval.decided_at >= (record.approval_deadline or 0)
    assert "approval deadline passed" in (done.error or "")
    (output,) = tool_messages(dex, "s1", record.key)
    assert output.startswith("The call was rejected and did not run")
    assert "approval deadline passed" in output
    assert starts(record.key) == []

    def kinds() -> list[tuple[str, str | None]]:
        return [(e["type"], e.get("decision") or e.get("status")) for e in events(dex, record.key)]

    # The finished event follows the record's SQL commit: waited for, not raced.
    wait_for(lambda: ("tool_call_finished", "rejected") in kinds(), timeout=30, what="the event")
    assert ("tool_call_decided", "expired") in kinds()
    assert dex.ledger.read(record.key) is None

    before = state(dex, record.key)
    with pytest.raises(ApprovalDeadlinePassed):
        client.approve(record.key, "alice")
    assert state(dex, record.key) == before
    assert starts(record.key) == []


# --- S6.3: every refusal changes nothing ---------------------------------------------------------


def test_deciding_twice_gets_already_decided_and_changes_nothing(dex: Dex) -> None:
    """S6.3: a second decision, of either kind, after either first decision, is refused with
    `AlreadyDecided` naming the first decider; record, history, ledger and events stay as
    they were."""
    client = dex.client()
    Decide = Callable[[str], ToolCallRecord]
    firsts: dict[str, Decide] = {
        "approve": lambda k: client.approve(k, "alice", "ok"),
        "reject": lambda k: client.reject(k, "alice", "no"),
    }
    seconds: dict[str, Decide] = {
        "approve": lambda k: client.approve(k, "bob"),
        "reject": lambda k: client.reject(k, "bob", "changed my mind"),
    }
    n = 0
    for first_kind, first in firsts.items():
        for second_kind, second in seconds.items():
            n += 1
            key = client.request_call("s1", f"t{n}", "c1", "guarded_write", {}).key
            first(key)
            before = state(dex, key)
            with pytest.raises(AlreadyDecided) as refused:
                second(key)
            assert refused.value.decided_by == "alice", (first_kind, second_kind)
            expected = "approved" if first_kind == "approve" else "rejected"
            assert refused.value.decision == expected
            assert "alice" in str(refused.value)
            assert state(dex, key) == before, (first_kind, second_kind)


def test_deciding_a_call_that_never_waited_is_refused(dex: Dex) -> None:
    """S6.3: a call that never needed approval gets `NotAwaitingApproval` (not
    `AlreadyDecided`) for an approval or a rejection, and nothing changes."""
    client = dex.client()
    key = client.request_call("s1", "t1", "c1", "echo", {"q": 1}).key
    before = state(dex, key)
    for decide in (client.approve, client.reject):
        with pytest.raises(NotAwaitingApproval) as refused:
            decide(key, "alice")
        assert not isinstance(refused.value, AlreadyDecided)
        assert "never needed approval" in str(refused.value)
        assert state(dex, key) == before


def test_deciding_after_the_deadline_rejects_at_once_and_changes_nothing_after(dex: Dex) -> None:
    """S6.2, S6.3: an approval or rejection that arrives after the deadline, before any sweep,
    is refused with `ApprovalDeadlinePassed`; the call is ended `rejected` (deadline) right
    then, never dispatched, and later decisions change nothing."""
    client = dex.client()
    for i, decide in enumerate((client.approve, client.reject)):
        record = client.request_call("s1", f"t{i}", "c1", "guarded_write_short", {})
        deadline = record.approval_deadline or 0
        wait_for(partial(_past, deadline + 0.05), timeout=10, what="the approval deadline")
        with pytest.raises(ApprovalDeadlinePassed):
            decide(record.key, "alice")
        done = client.get_call(record.key)
        assert done.status is CallStatus.REJECTED
        assert done.approval is not None and done.approval.decision == "expired"
        assert "approval deadline passed" in (done.error or "")
        assert len(tool_messages(dex, "s1", record.key)) == 1
        assert dex.ledger.read(record.key) is None
        before = state(dex, record.key)
        for again in (client.approve, client.reject):
            with pytest.raises(ApprovalDeadlinePassed):
                again(record.key, "bob")
        assert state(dex, record.key) == before
    assert client.pending_approvals() == []


def test_unknown_and_malformed_keys_and_bad_approvers_are_refused(dex: Dex) -> None:
    """S6.3, S9.3: an unknown key (`UnknownCall`), a malformed key (`InvalidId`) and a decision
    without a usable approver name (`InvalidDecision`) are typed errors that write nothing."""
    client = dex.client()
    key = client.request_call("s1", "t1", "c1", "guarded_write", {}).key
    before = state(dex, key)
    with pytest.raises(UnknownCall):
        client.approve("s1/t1/nope", "alice")
    with pytest.raises(UnknownCall):
        client.reject("s9/t1/c1", "alice")
    for bad in ("", "not-a-key", "s1/t1", "s1/t1/c1/x", "s1//c1", "s1/t1/c1#1", 42):
        for decide in (client.approve, client.reject):
            with pytest.raises(InvalidId):
                decide(bad, "alice")  # type: ignore[arg-type]
    for approver in ("", "   ", "a\nb", "x" * 201):
        with pytest.raises(InvalidDecision):
            client.approve(key, approver)
    assert state(dex, key) == before
    assert client.get_call(key).status is CallStatus.AWAITING_APPROVAL


# --- listing -------------------------------------------------------------------------------


def test_listing_pending_approvals_oldest_first_with_secrets_redacted(dex: Dex) -> None:
    """S6.1, S9.2: the list shows what waits, all or one session's, oldest first, with tool,
    effect, deadline and arguments whose secrets are redacted; decided calls leave it."""
    dex.tool(
        "charge_card",
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE,
            approval_timeout=600,
            secret_arguments=("token",),
        ),
    )(_noop)
    client = dex.client()
    a = client.request_call("s1", "t1", "c1", "charge_card", {"amount": 1, "token": "sk-1"})
    b = client.request_call("s2", "t1", "c1", "guarded_write", {"value": "x"})
    c = client.request_call(
        "s1", "t2", "c1", "charge_card", {"amount": 3, "meta": {"token": "sk-3"}}
    )
    client.request_call("s1", "t3", "c1", "echo", {})  # never waits

    listed = client.pending_approvals()
    assert [p.key for p in listed] == [a.key, b.key, c.key]
    first = listed[0]
    assert first.tool_name == "charge_card"
    assert first.effect is EffectClass.NON_IDEMPOTENT_WRITE
    assert first.arguments == {"amount": 1, "token": "***"}
    assert listed[2].arguments == {"amount": 3, "meta": {"token": "***"}}
    assert first.deadline == pytest.approx(a.requested_at + 600)
    assert listed[1].deadline == pytest.approx(b.requested_at + dex.settings.approval_timeout)
    assert "sk-" not in json.dumps([p.as_dict() for p in listed])

    assert [p.key for p in client.pending_approvals("s1")] == [a.key, c.key]
    assert [p.key for p in client.pending_approvals(limit=1)] == [a.key]
    client.approve(a.key, "alice")
    client.reject(b.key, "alice")
    assert [p.key for p in asyncio.run(AsyncDexClient(dex).pending_approvals())] == [c.key]


def test_async_client_decides(dex: Dex) -> None:
    """S6.1: the async client offers the same decisions and the same typed errors."""
    client = AsyncDexClient(dex)

    async def scenario() -> None:
        a = await client.request_call("s1", "t1", "c1", "guarded_write", {})
        b = await client.request_call("s1", "t1", "c2", "guarded_write", {})
        approved = await client.approve(a.key, "alice", "fine")
        assert approved.status is CallStatus.PENDING
        assert approved.approval is not None and approved.approval.note == "fine"
        rejected = await client.reject(b.key, "alice", "too much")
        assert rejected.status is CallStatus.REJECTED
        with pytest.raises(AlreadyDecided):
            await client.approve(b.key, "bob")

    asyncio.run(scenario())


# --- a crash between the approval and the publish -------------------------------------------


def test_crash_between_approval_and_publish_is_started_by_the_sweeper(
    dex: Dex,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The crash table (docs/ledger.md, first row) for approvals, S6.2: the approval is committed but the
    process dies before opening the attempt, leaving a `pending` call with no ledger entry. The
    sweeper's orphan check opens and publishes it (nothing ran), and it runs exactly once. The
    second call's ledger lost its data while the call waited (new epoch); the approval records
    the epoch it was approved in, so it is still started, not ended `outcome_unknown`."""
    crashed: list[str] = []
    real_start = Opener.start

    def crash_once(
        self: Opener, record: ToolCallRecord, arguments: Any = None, **options: Any
    ) -> None:
        if record.key not in crashed:
            crashed.append(record.key)
            raise RuntimeError("simulated crash after the approval was committed")
        real_start(self, record, arguments, **options)

    start_worker()
    client = dex.client()
    a = client.request_call("s1", "t1", "c1", "guarded_write", {"value": 1})
    b = client.request_call("s1", "t2", "c1", "guarded_write", {"value": 2})
    monkeypatch.setattr(Opener, "start", crash_once)

    approved = client.approve(a.key, "alice")
    assert approved.status is CallStatus.PENDING and crashed == [a.key]
    (done,) = client.wait([a.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert len(starts(a.key)) == 1

    dex.ledger.client.delete(dex.keys.epoch)  # Redis came back empty while b waited
    approved = client.approve(b.key, "alice")
    assert approved.status is CallStatus.PENDING and crashed == [a.key, b.key]
    assert approved.ledger_epoch == dex.epoch()
    (done,) = client.wait([b.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert len(starts(b.key)) == 1
