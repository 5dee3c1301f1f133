"""The maintained counts of ended calls equal a grouped scan of the calls, on SQLite and on
PostgreSQL, whoever ended them (docs/operations.md, "Metrics"; `store/counts.py`).

Every writer of an outcome goes through the store: the worker's batched outcomes (some losing
the race to another writer), retries (more than one attempt), approvals, a person's rejection,
an approval deadline's expiry, and the sweeper's single writes (`outcome_unknown`, "did not
run"). After the mix, the metrics' reads (`OperatorViews`) must equal the scans they replace,
and so must the counts a migration fills in from calls ended before it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import column, insert, table

from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass
from dex_celery.model.records import ApprovalDecision
from dex_celery.store import migrate
from dex_celery.store.repository import Store
from dex_celery.store.schema import unknown_outcomes
from dex_celery.store.sql_engine import make_engine
from dex_celery.store.unknowns import REPORTED
from dex_celery.store.values import Outcome, OutcomeRow
from dex_celery.store.views import OperatorViews, OutcomeCount
from tests.support.stores.pg_database import fresh_database
from tests.support.stores.store_rig import Clock, new_call
from tests.support.stores.store_rig import store as store
from tests.support.stores.store_rig import url as url


def ordered(counts: list[OutcomeCount]) -> list[OutcomeCount]:
    return sorted(counts, key=lambda c: (c.tool, c.effect, c.status))


def ended(status: CallStatus, attempts: int, error: str = "") -> Outcome:
    return Outcome(
        status,
        error or status.value,
        "r" if status is CallStatus.SUCCEEDED else None,
        attempts=attempts,
    )


def row(key: str, tool: str, outcome: Outcome) -> OutcomeRow:
    return OutcomeRow(CallKey.parse(key), tool, "{}", outcome)


def make_mix(store: Store) -> None:
    """Calls of two tools and three effect classes ended every way the engine ends them."""
    clock = store.clock
    assert isinstance(clock, Clock)
    calls = [new_call(f"s/t/r{i}") for i in range(6)]
    calls += [
        new_call(
            f"s/t/w{i}",
            tool="pay",
            effect=EffectClass.NON_IDEMPOTENT_WRITE,
            requires_approval=False,
        )
        for i in range(4)
    ]
    calls += [
        new_call(f"s/t/i{i}", tool="pay", effect=EffectClass.IDEMPOTENT_WRITE) for i in range(2)
    ]
    calls += [
        new_call(
            f"s/t/a{i}",
            tool="pay",
            effect=EffectClass.NON_IDEMPOTENT_WRITE,
            requires_approval=True,
            approval_timeout=60,
        )
        for i in range(4)
    ]
    store.insert_calls(calls, epoch="e1")
    # The worker's batches: first attempts, retries, a failure; one key twice (a lost race).
    store.record_outcomes(
        [
            row("s/t/r0", "echo", ended(CallStatus.SUCCEEDED, 1)),
            row("s/t/r1", "echo", ended(CallStatus.SUCCEEDED, 3)),
            row("s/t/r2", "echo", ended(CallStatus.FAILED, 2)),
            row("s/t/w0", "pay", ended(CallStatus.SUCCEEDED, 1)),
            row("s/t/i0", "pay", ended(CallStatus.FAILED, 4)),
        ]
    )
    store.record_outcomes(
        [
            row("s/t/r0", "echo", ended(CallStatus.FAILED, 2)),  # ended already: changes nothing
            row("s/t/r3", "echo", ended(CallStatus.OUTCOME_UNKNOWN, 1)),
            # "did not run" of a write nobody claimed: the conditional single write
            row(
                "s/t/w1",
                "pay",
                Outcome(CallStatus.FAILED, "did not run", attempts=1, did_not_run=True),
            ),
        ]
    )
    # The sweeper: a claimed write lost (outcome_unknown), a write fence's refusal, orphans.
    assert store.claim_write("s/t/w2", 1, fence="f", owner="gone:1", now=clock())
    assert not store.record_outcome(
        "s/t/w2", Outcome(CallStatus.FAILED, "x", attempts=1, did_not_run=True)
    )
    assert store.record_outcome("s/t/w2", ended(CallStatus.OUTCOME_UNKNOWN, 1))
    assert store.record_outcome("s/t/r4", Outcome(CallStatus.OUTCOME_UNKNOWN, "lost"))
    assert not store.record_outcome("s/t/r4", ended(CallStatus.SUCCEEDED, 1))  # once only
    # Approvals: one approved then run, one rejected by a person, one expired, one left waiting.
    now = clock()
    assert store.decide("s/t/a0", ApprovalDecision("approved", "ann", now, None), now=now)
    store.record_outcomes([row("s/t/a0", "pay", ended(CallStatus.SUCCEEDED, 1))])
    assert store.record_outcome(
        "s/t/a1",
        Outcome(CallStatus.REJECTED, "rejected by bob"),
        from_statuses=(CallStatus.AWAITING_APPROVAL,),
        decision=ApprovalDecision("rejected", "bob", now, "no"),
        deadline_after=now,
    )
    clock.now += 120
    assert store.record_outcome(
        "s/t/a2",
        Outcome(CallStatus.REJECTED, "expired"),
        from_statuses=(CallStatus.AWAITING_APPROVAL,),
    )
    # s/t/r5, s/t/w3, s/t/i1 stay pending; s/t/a3 waits (past its deadline, not yet swept).


def test_counts_equal_a_grouped_scan_after_every_kind_of_outcome(store: Store) -> None:
    views = OperatorViews(store)
    assert views.count_by_outcome() == [] == views.count_by_outcome_scan()
    make_mix(store)
    counts = ordered(views.count_by_outcome())
    assert counts == ordered(views.count_by_outcome_scan())
    by = {(c.tool, c.status): c for c in counts}
    # The mix reached every status, and retries count attempts after the first.
    assert {s for _, s in by} == {s.value for s in CallStatus}
    assert (by["echo", "succeeded"].calls, by["echo", "succeeded"].retries) == (2, 2)
    assert by["pay", "awaiting_approval"].calls == 1
    # The unknowns not yet reported: three, then two once the reconcile job reported one.
    assert views.count_unreported_unknowns() == 3 == views.count_unreported_unknowns_scan()
    with store.engine.begin() as conn:
        conn.execute(
            insert(unknown_outcomes).values(
                call_key="s/t/r3",
                session_id="s",
                tool_name="echo",
                state=REPORTED,
                surfaced_at=1.0,
                checks=1,
            )
        )
    assert views.count_unreported_unknowns() == 2 == views.count_unreported_unknowns_scan()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_migration_counts_the_calls_ended_before_it(backend: str, tmp_path: Path) -> None:
    """A database with history at revision 0005 gets its counts filled in by the upgrade."""
    if backend == "sqlite":
        _migrate_with_history(f"sqlite:///{tmp_path / 'old.db'}")
    else:
        with fresh_database("dex_counts") as url:
            _migrate_with_history(url)


def _migrate_with_history(url: str) -> None:
    migrate.upgrade(url, "0005")
    history = [  # (tool, effect, status, attempts)
        ("echo", "read", "succeeded", 1),
        ("echo", "read", "succeeded", 3),
        ("echo", "read", "failed", 2),
        ("echo", "read", "pending", 0),
        ("pay", "non_idempotent_write", "outcome_unknown", 1),
        ("pay", "non_idempotent_write", "rejected", 0),
        ("pay", "non_idempotent_write", "awaiting_approval", 0),
        ("pay", "idempotent_write", "failed", 4),
    ]
    calls = table(
        "dex_tool_calls",
        *(
            column(c)
            for c in (
                "key",
                "session_id",
                "turn_id",
                "tool_call_id",
                "tool_name",
                "arguments",
                "effect",
                "requires_approval",
                "policy",
                "status",
                "attempts",
                "requested_at",
            )
        ),
    )
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(
            insert(calls),
            [
                dict(
                    key=f"s/t/c{i}",
                    session_id="s",
                    turn_id="t",
                    tool_call_id=f"c{i}",
                    tool_name=tool,
                    arguments="{}",
                    effect=effect,
                    requires_approval=0,
                    policy="{}",
                    status=status,
                    attempts=attempts,
                    requested_at=1.0,
                )
                for i, (tool, effect, status, attempts) in enumerate(history)
            ],
        )
    engine.dispose()
    migrate.upgrade(url)
    store = Store(url, clock=Clock())
    views = OperatorViews(store)
    counts = ordered(views.count_by_outcome())
    assert counts == ordered(views.count_by_outcome_scan())
    assert len(counts) == 7
    # And from there on the writes add to the filled-in counts.
    store.insert_calls([new_call("s/t/late")], epoch="e1")
    store.record_outcomes([row("s/t/late", "echo", ended(CallStatus.SUCCEEDED, 2))])
    assert ordered(views.count_by_outcome()) == ordered(views.count_by_outcome_scan())
    assert {(c.tool, c.status): c.calls for c in views.count_by_outcome()}["echo", "succeeded"] == 3
    store.engine.dispose()
