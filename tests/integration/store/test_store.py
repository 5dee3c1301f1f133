"""The SQL system of record on SQLite and on PostgreSQL (S2.3, S4.1, S4.4, S6.3, S7.1, S7.2).

Every test runs on a fresh SQLite file and on the running PostgreSQL, in a schema of its own
that is dropped afterwards, so the conditional updates and insert-or-ignore paths are checked
on both dialects. The PostgreSQL half is skipped, saying why, only if the server is unreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from sqlalchemy import func, select

from dex_celery import OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, MessageRole
from dex_celery.errors import UnknownSession
from dex_celery.model.conversation import CopiedMessage
from dex_celery.model.ids import CallKey
from dex_celery.model.policy import EffectClass
from dex_celery.model.records import ApprovalDecision
from dex_celery.store.repository import Store
from dex_celery.store.schema import messages, sessions, tool_calls
from dex_celery.store.values import Outcome, OutcomeRow
from tests.support.stores.store_rig import Clock, new_call
from tests.support.stores.store_rig import url as url

T = TypeVar("T")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(url: str, clock: Clock) -> Iterator[Store]:
    store = Store(url, clock=clock)
    store.create_schema()
    yield store
    store.engine.dispose()


def rows(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
            for t in (sessions, messages, tool_calls)
        }


def in_threads(n: int, fn: Callable[[int], T]) -> list[T]:
    """Run `fn(i)` in `n` threads released together; re-raise the first error."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = fn(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 60 s"
    if errors:
        raise errors[0]
    return results


# --- insert_calls ------------------------------------------------------------------------------


def test_insert_calls_records_new_calls_and_returns_duplicates_as_they_are(store: Store) -> None:
    """S2.3: a key already recorded returns its record (created=False), never a second row."""
    out = store.insert_calls([new_call("s/t/a"), new_call("s/t/b")], epoch="e1")
    assert [(r.key, created) for r, created in out] == [("s/t/a", True), ("s/t/b", True)]
    first = out[0][0]
    assert (first.status, first.effect, first.ledger_epoch) == (
        CallStatus.PENDING,
        EffectClass.READ,
        "e1",
    )
    assert (first.session_id, first.turn_id, first.tool_call_id) == ("s", "t", "a")
    again = store.insert_calls(
        [new_call("s/t/a", arguments='{"q":2}', tool="other"), new_call("s/t/c")], epoch="e2"
    )
    assert [(r.key, created) for r, created in again] == [("s/t/a", False), ("s/t/c", True)]
    assert again[0][0] == store.get_call("s/t/a")
    assert (again[0][0].arguments, again[0][0].tool_name, again[0][0].ledger_epoch) == (
        '{"q":1}',
        "echo",
        "e1",
    )
    same_batch = store.insert_calls([new_call("s/t/d"), new_call("s/t/d")], epoch="e1")
    assert [created for _, created in same_batch] == [True, False]
    assert rows(store) == {"dex_sessions": 1, "dex_messages": 0, "dex_tool_calls": 4}


def test_insert_calls_keeps_the_policy_snapshot_and_approval_deadline(
    store: Store, clock: Clock
) -> None:
    """S1.5, S6.1: the snapshot that applied at request time; approval waits with a deadline."""
    ((record, _),) = store.insert_calls(
        [new_call("s/t/w", effect=EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=30.0)],
        epoch="e",
    )
    assert record.status is CallStatus.AWAITING_APPROVAL
    assert record.approval_deadline == clock.now + 30.0
    stored = store.get_call("s/t/w")
    assert stored is not None
    assert stored.policy == record.policy
    assert (stored.policy.max_attempts, stored.policy.requires_approval) == (1, True)


def test_insert_calls_resolves_with_the_session_default(store: Store) -> None:
    """S1.4: a tool without a class of its own takes the session's default effect."""
    store.open_session("s", EffectClass.IDEMPOTENT_WRITE)
    ((record, _),) = store.insert_calls([new_call("s/t/x", effect=None)], epoch="e")
    assert (record.effect, record.status) == (EffectClass.IDEMPOTENT_WRITE, CallStatus.PENDING)
    ((other, _),) = store.insert_calls([new_call("s2/t/x", effect=None)], epoch="e")
    assert (other.effect, other.status) == (EffectClass.UNCLASSIFIED, CallStatus.AWAITING_APPROVAL)


def test_concurrent_requests_of_the_same_call_create_one(url: str) -> None:
    """S2.3: many processes asking for the same new call at once: one row, one `created`.

    Each thread has its own Store (its own engine and connections), like separate processes,
    and the session is new too, so the session insert races as well.
    """
    stores = [Store(url) for _ in range(6)]
    stores[0].create_schema()
    try:
        results = in_threads(
            len(stores), lambda i: stores[i].insert_calls([new_call("race/t/c")], epoch="e")
        )
    finally:
        for s in stores[1:]:
            s.engine.dispose()
    created = [created for ((_, created),) in results]
    assert created.count(True) == 1
    assert {record.key for ((record, _),) in results} == {"race/t/c"}
    assert rows(stores[0]) == {"dex_sessions": 1, "dex_messages": 0, "dex_tool_calls": 1}
    stores[0].engine.dispose()


def test_concurrent_requests_of_different_calls_in_one_new_session(url: str) -> None:
    """S2.3: calls of a brand-new session requested at once all land; one session row."""
    stores = [Store(url) for _ in range(6)]
    stores[0].create_schema()
    try:
        results = in_threads(
            len(stores),
            lambda i: stores[i].insert_calls([new_call(f"fresh/t/c{i}")], epoch="e"),
        )
    finally:
        for s in stores[1:]:
            s.engine.dispose()
    assert all(created for ((_, created),) in results)
    assert rows(stores[0]) == {"dex_sessions": 1, "dex_messages": 0, "dex_tool_calls": 6}
    stores[0].engine.dispose()


# --- record_outcome ----------------------------------------------------------------------------


def test_record_outcome_lands_once_with_one_tool_message(store: Store, clock: Clock) -> None:
    """S4.1, S4.4, S7.2: one outcome and one TOOL message per call, however often written."""
    store.insert_calls([new_call("s/t/a")], epoch="e")
    clock.now += 5
    assert store.record_outcome("s/t/a", Outcome(CallStatus.SUCCEEDED, "", result='{"n":1}'))
    assert not store.record_outcome("s/t/a", Outcome(CallStatus.FAILED, "second writer"))
    record = store.get_call("s/t/a")
    assert record is not None
    assert (record.status, record.result, record.error, record.finished_at) == (
        CallStatus.SUCCEEDED,
        '{"n":1}',
        None,
        clock.now,
    )
    _calls, history = store.snapshot("s")
    tool_messages = [m for m in history if m.role is MessageRole.TOOL]
    assert len(tool_messages) == 1
    message = tool_messages[0]
    assert (message.tool_output, message.turn_id, message.tool_call_id) == ('{"n":1}', "t", "a")
    assert (message.tool_name, message.tool_arguments, message.text) == ("echo", '{"q":1}', None)


def test_record_outcomes_batch_ends_only_pending_calls_once(store: Store, clock: Clock) -> None:
    """S4.1, S6.2: the worker's batched write ends each pending call once, with its TOOL
    message; a call already ended, one waiting for approval, and an unknown key are untouched."""
    store.insert_calls(
        [
            new_call("s/t/a"),
            new_call("s/t/b"),
            new_call("s/t/done"),
            new_call("s/t/wait", effect=EffectClass.UNCLASSIFIED),
        ],
        epoch="e",
    )
    assert store.record_outcome("s/t/done", Outcome(CallStatus.FAILED, "first writer"))
    clock.now += 3

    def row(key: str, outcome: Outcome) -> OutcomeRow:
        return OutcomeRow(CallKey.parse(key), "echo", '{"q":1}', outcome)

    store.record_outcomes(
        [
            row("s/t/a", Outcome(CallStatus.SUCCEEDED, "", result='"A"', attempts=1)),
            row("s/t/b", Outcome(CallStatus.OUTCOME_UNKNOWN, "lost", attempts=1)),
            row("s/t/done", Outcome(CallStatus.SUCCEEDED, "", result='"late"', attempts=1)),
            row("s/t/wait", Outcome(CallStatus.SUCCEEDED, "", result='"no"', attempts=1)),
            row("s/t/ghost", Outcome(CallStatus.SUCCEEDED, "", result='"no"', attempts=1)),
        ]
    )
    got = {k: store.get_call(f"s/t/{k}") for k in ("a", "b", "done", "wait")}
    assert got["a"] is not None and (got["a"].status, got["a"].result) == (
        CallStatus.SUCCEEDED,
        '"A"',
    )
    assert got["a"].finished_at == clock.now
    assert got["b"] is not None and got["b"].status is CallStatus.OUTCOME_UNKNOWN
    assert got["done"] is not None and (got["done"].status, got["done"].error) == (
        CallStatus.FAILED,
        "first writer",
    )
    assert got["wait"] is not None and got["wait"].status is CallStatus.AWAITING_APPROVAL
    _calls, history = store.snapshot("s")
    by_call = {m.tool_call_id: m.tool_output for m in history if m.role is MessageRole.TOOL}
    assert by_call.keys() == {"a", "b", "done"}
    assert by_call["a"] == '"A"'
    assert OUTCOME_UNKNOWN_TOOL_RESULT in (by_call["b"] or "")
    assert by_call["done"] == "Error: first writer"
    store.record_outcomes([row("s/t/a", Outcome(CallStatus.FAILED, "again", attempts=2))])
    assert rows(store)["dex_messages"] == 3


def test_concurrent_record_outcome_has_one_winner(url: str) -> None:
    """S4.1: the worker, the fast path and the sweeper racing: one outcome, one message."""
    stores = [Store(url) for _ in range(6)]
    stores[0].create_schema()
    stores[0].insert_calls([new_call("s/t/a", effect=EffectClass.IDEMPOTENT_WRITE)], epoch="e")
    statuses = [CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.OUTCOME_UNKNOWN] * 2
    try:
        won = in_threads(
            len(stores),
            lambda i: stores[i].record_outcome(
                "s/t/a", Outcome(statuses[i], "" if i % 3 == 0 else f"writer {i}", result="1")
            ),
        )
    finally:
        for s in stores[1:]:
            s.engine.dispose()
    assert won.count(True) == 1
    winner = statuses[won.index(True)]
    record = stores[0].get_call("s/t/a")
    assert record is not None and record.status is winner
    assert rows(stores[0])["dex_messages"] == 1
    stores[0].engine.dispose()


def test_outcome_unknown_message_carries_the_constant(store: Store) -> None:
    """S4.5: the TOOL message of an outcome_unknown call contains OUTCOME_UNKNOWN_TOOL_RESULT."""
    store.insert_calls([new_call("s/t/w", effect=EffectClass.IDEMPOTENT_WRITE)], epoch="e")
    assert store.record_outcome("s/t/w", Outcome(CallStatus.OUTCOME_UNKNOWN, "worker died"))
    (_call,), history = store.snapshot("s")
    assert OUTCOME_UNKNOWN_TOOL_RESULT in (history[0].tool_output or "")
    assert _call.error == "worker died"


def test_record_outcome_only_from_the_given_statuses(store: Store) -> None:
    """S6.2: a call waiting for approval is not ended by a worker's write; only by rejection."""
    store.insert_calls([new_call("s/t/w", effect=EffectClass.UNCLASSIFIED)], epoch="e")
    assert not store.record_outcome("s/t/w", Outcome(CallStatus.SUCCEEDED, "", result="1"))
    assert not store.record_outcome("s/t/none", Outcome(CallStatus.FAILED, "x"))
    assert rows(store)["dex_messages"] == 0
    decision = ApprovalDecision("rejected", "alice", 1.0, "no")
    assert store.record_outcome(
        "s/t/w",
        Outcome(CallStatus.REJECTED, "rejected by alice"),
        from_statuses=(CallStatus.AWAITING_APPROVAL,),
        decision=decision,
    )
    record = store.get_call("s/t/w")
    assert record is not None
    assert (record.status, record.approval) == (CallStatus.REJECTED, decision)


def test_late_result_is_evidence_only(store: Store) -> None:
    """S5.2: a late result never touches status, error or result."""
    store.insert_calls([new_call("s/t/a")], epoch="e")
    store.record_outcome("s/t/a", Outcome(CallStatus.FAILED, "timed out"))
    store.record_late_result("s/t/a", '{"payload":"late"}')
    record = store.get_call("s/t/a")
    assert record is not None
    assert (record.status, record.error, record.result, record.late_result) == (
        CallStatus.FAILED,
        "timed out",
        None,
        '{"payload":"late"}',
    )
    assert rows(store)["dex_messages"] == 1


# --- decide ------------------------------------------------------------------------------------


def test_decide_is_a_conditional_update(store: Store, clock: Clock) -> None:
    """S6.3: deciding twice, deciding a call that is not waiting, or after the deadline: no."""
    store.insert_calls(
        [
            new_call("s/t/w", effect=EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=60.0),
            new_call("s/t/late", effect=EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=10.0),
            new_call("s/t/read"),
        ],
        epoch="e",
    )
    approve = ApprovalDecision("approved", "alice", clock.now + 1, "fine")
    assert store.decide("s/t/w", approve, now=clock.now + 1)
    assert not store.decide("s/t/w", ApprovalDecision("approved", "bob", 2.0, None), now=2.0)
    record = store.get_call("s/t/w")
    assert record is not None
    assert (record.status, record.approval) == (CallStatus.PENDING, approve)
    assert not store.decide("s/t/read", approve, now=clock.now + 1)
    assert not store.decide("s/t/late", approve, now=clock.now + 10)  # the deadline itself
    assert not store.decide("s/t/none", approve, now=clock.now)
    late = store.get_call("s/t/late")
    assert late is not None and (late.status, late.approval) == (CallStatus.AWAITING_APPROVAL, None)


def test_concurrent_decisions_have_one_winner(url: str) -> None:
    """S6.3: two people approving at once: one decision stands."""
    stores = [Store(url) for _ in range(5)]
    stores[0].create_schema()
    stores[0].insert_calls([new_call("s/t/w", effect=EffectClass.UNCLASSIFIED)], epoch="e")
    try:
        won = in_threads(
            len(stores),
            lambda i: stores[i].decide(
                "s/t/w", ApprovalDecision("approved", f"person{i}", 1.0, None), now=1_000.0
            ),
        )
    finally:
        for s in stores[1:]:
            s.engine.dispose()
    assert won.count(True) == 1
    record = stores[0].get_call("s/t/w")
    assert record is not None and record.approval is not None
    assert record.approval.decided_by == f"person{won.index(True)}"
    stores[0].engine.dispose()


# --- sweeper reads -----------------------------------------------------------------------------


def test_approvals_due_in_deadline_order_with_a_limit(store: Store, clock: Clock) -> None:
    """docs/ledger.md, "Sweeps": approvals past their deadline, oldest deadline first, at most `limit`."""
    for name, timeout in [("c", 30.0), ("a", 10.0), ("d", 500.0), ("b", 20.0)]:
        store.insert_calls(
            [new_call(f"s/t/{name}", effect=EffectClass.UNCLASSIFIED, approval_timeout=timeout)],
            epoch="e",
        )
    store.insert_calls([new_call("s/t/read")], epoch="e")
    decided = "s/t/x"
    store.insert_calls(
        [new_call(decided, effect=EffectClass.UNCLASSIFIED, approval_timeout=5.0)], epoch="e"
    )
    assert store.decide(decided, ApprovalDecision("approved", "p", 1.0, None), now=clock.now)
    base = clock.now
    assert [r.key for r in store.approvals_due(base + 30, limit=10)] == ["s/t/a", "s/t/b", "s/t/c"]
    assert [r.key for r in store.approvals_due(base + 30, limit=2)] == ["s/t/a", "s/t/b"]
    assert [r.key for r in store.approvals_due(base + 19.9, limit=10)] == ["s/t/a"]
    assert store.approvals_due(base, limit=10) == []


def test_in_flight_before_in_request_order_with_a_limit(store: Store, clock: Clock) -> None:
    """docs/ledger.md, "Sweeps": pending calls requested before a time, oldest first, at most `limit`."""
    for name in ["b", "a", "c", "d"]:
        store.insert_calls([new_call(f"s/t/{name}")], epoch="e")
        clock.now += 1
    store.insert_calls([new_call("s/t/waits", effect=EffectClass.UNCLASSIFIED)], epoch="e")
    store.record_outcome("s/t/c", Outcome(CallStatus.SUCCEEDED, "", result="1"))
    assert [r.key for r in store.in_flight_before(1_003.5, limit=10)] == [
        "s/t/b",
        "s/t/a",
        "s/t/d",
    ]
    assert [r.key for r in store.in_flight_before(1_003.5, limit=2)] == ["s/t/b", "s/t/a"]
    assert [r.key for r in store.in_flight_before(1_001.0, limit=10)] == ["s/t/b"]
    assert store.in_flight_before(1_000.0, limit=10) == []


# --- sessions, snapshot, messages --------------------------------------------------------------


def test_snapshot_returns_calls_and_history_in_order(store: Store, clock: Clock) -> None:
    """S7.1, S7.2, S7.4: the session's calls and its messages in the order they happened."""
    store.open_session("s")
    first = store.append_message("s", MessageRole.USER, "cancel order 1002")
    assert (first.role, first.text, first.created_at) == (
        MessageRole.USER,
        "cancel order 1002",
        clock.now,
    )
    assert first.id > 0
    clock.now += 1
    store.insert_calls([new_call("s/t1/b"), new_call("s/t1/a")], epoch="e")
    clock.now += 1
    store.insert_calls([new_call("s/t2/a")], epoch="e")
    store.insert_calls([new_call("other/t/a")], epoch="e")
    store.record_outcome("s/t1/a", Outcome(CallStatus.FAILED, "no such order"))
    store.append_message("s", MessageRole.ASSISTANT, "It failed.")
    calls, history = store.snapshot("s")
    assert [c.key for c in calls] == ["s/t1/a", "s/t1/b", "s/t2/a"]
    assert [c.status for c in calls] == [CallStatus.FAILED, CallStatus.PENDING, CallStatus.PENDING]
    assert calls[0].error == "no such order"
    assert [(m.role, m.text) for m in history] == [
        (MessageRole.USER, "cancel order 1002"),
        (MessageRole.TOOL, None),
        (MessageRole.ASSISTANT, "It failed."),
    ]
    assert history[1].tool_output == "Error: no such order"
    assert history[0].id < history[1].id < history[2].id


def test_open_session_is_idempotent_and_keeps_the_first_default(store: Store) -> None:
    s1 = store.open_session("s", EffectClass.READ)
    s2 = store.open_session("s", EffectClass.UNCLASSIFIED)
    assert s1 == s2
    assert store.get_session("s").default_effect is EffectClass.READ
    assert rows(store)["dex_sessions"] == 1


def test_unknown_session(store: Store) -> None:
    """S7.1, S7.4, S9.3: reading or writing a session that does not exist is a typed error."""
    with pytest.raises(UnknownSession):
        store.snapshot("nobody")
    with pytest.raises(UnknownSession):
        store.append_message("nobody", MessageRole.USER, "hello")
    with pytest.raises(UnknownSession):
        store.get_session("nobody")
    assert rows(store) == {"dex_sessions": 0, "dex_messages": 0, "dex_tool_calls": 0}


def test_claim_write_is_one_compare_and_set(store: Store) -> None:
    """The write fence (docs/ledger.md): the first fence claims a pending call, the same fence
    again succeeds (a retried command), another fence or an ended call is refused."""
    store.insert_calls(
        [
            new_call(key, effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False)
            for key in ("s/t/w", "s/t/x")
        ],
        epoch="e",
    )
    assert store.claim_write("s/t/w", 1, fence="f1", owner="w:1", now=5.0)
    assert store.claim_write("s/t/w", 1, fence="f1", owner="w:1", now=6.0)
    assert not store.claim_write("s/t/w", 2, fence="f2", owner="w:2", now=7.0)
    record = store.get_call("s/t/w")
    assert record is not None and (record.claimed_by, record.claimed_at) == ("w:1", 6.0)
    assert store.record_outcome("s/t/x", Outcome(CallStatus.FAILED, "ended"))
    assert not store.claim_write("s/t/x", 1, fence="f3", owner="w:3", now=8.0)
    assert not store.claim_write("s/t/ghost", 1, fence="f4", owner="w:4", now=9.0)


def test_a_frameworks_messages_are_copied_once_and_dex_messages_listed(store: Store) -> None:
    """S12.1: copies are kept once per key (a history seen again, two calls copying at once),
    scrubbed again when a later call's secrets are known, and told apart from the messages
    written through dex, which are what a framework is handed."""
    asked = CopiedMessage("k-ask", MessageRole.USER, "refund to card 4111-2222")
    said = CopiedMessage("k-said", MessageRole.ASSISTANT, "On it.")
    assert store.copy_messages("conv", [asked, said]) == 2  # the session is created
    assert store.copy_messages("conv", [asked, said]) == 0
    store.append_message("conv", MessageRole.USER, "a report")
    assert store.copy_messages(
        "conv", [CopiedMessage("k-next", MessageRole.USER, "thanks")],
        lambda text: text.replace("4111-2222", "***"),
    ) == 1  # fmt: skip
    _calls, history = store.snapshot("conv")
    assert [(m.role, m.text, m.mirrored) for m in history] == [
        (MessageRole.USER, "refund to card ***", True),
        (MessageRole.ASSISTANT, "On it.", True),
        (MessageRole.USER, "a report", False),
        (MessageRole.USER, "thanks", True),
    ]
    assert [m.text for m in store.sent_user_messages("conv")] == ["a report"]
    assert store.sent_user_messages("no-such-session") == []


def test_a_dex_message_is_taken_by_one_run_of_the_session(store: Store) -> None:
    """S12.1, for a framework whose runs share no history (CrewAI's kickoffs): the first run to
    ask after a message was sent takes it, the same run asking again gets it again, a later
    run never does; of many runs asking at once, exactly one takes it."""
    store.open_session("crew")
    assert store.take_user_messages("crew", "run-a") == []
    store.append_message("crew", MessageRole.USER, "a report")
    assert [m.text for m in store.take_user_messages("crew", "run-a")] == ["a report"]
    assert [m.text for m in store.take_user_messages("crew", "run-a")] == ["a report"]
    assert store.take_user_messages("crew", "run-b") == []
    store.append_message("crew", MessageRole.USER, "another")
    assert [m.text for m in store.take_user_messages("crew", "run-b")] == ["another"]
    assert [m.text for m in store.take_user_messages("crew", "run-a")] == ["a report"]
    _calls, history = store.snapshot("crew")
    assert [(m.text, m.turn_id) for m in history] == [("a report", "run-a"), ("another", "run-b")]
    assert [m.text for m in store.sent_user_messages("crew")] == ["a report", "another"]

    store.append_message("crew", MessageRole.USER, "raced")
    took = in_threads(8, lambda i: [m.text for m in store.take_user_messages("crew", f"r{i}")])
    assert sorted(t for texts in took for t in texts if t == "raced") == ["raced"]
