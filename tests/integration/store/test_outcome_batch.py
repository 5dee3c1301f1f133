"""The recorder's batch (`Store.record_outcomes`) ends each call as it would alone, on SQLite and
on PostgreSQL (S4.1, S6.2, S13.1.3, S13.4.1; docs/architecture.md, `OutcomeWriter`).

On PostgreSQL a batch's calls end in one UPDATE joined to a `VALUES` list, their TOOL messages
and audit entries in one INSERT each (`store/many_rows.py`); SQLite keeps its prepared UPDATE
per call and takes the inserts whole. Whatever the statements, a mixed batch (calls that
succeed, fail, end `outcome_unknown` holding a budget's charge, rows whose guard refuses them:
a call another writer ended, one waiting for approval, an unknown key, the same key twice, a
"did not run" of a call whose write was claimed, and an outcome after a late result) must leave
every call, message, count and audit entry as the same rows written one at a time do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from dex_celery.audit.entries import AuditKind, Entry
from dex_celery.audit.keys import Signer
from dex_celery.audit.verify import verify_database
from dex_celery.model.budgets import Budget, charge_of
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass
from dex_celery.store import many_rows as store_many_rows
from dex_celery.store.audit_sql import ENTRY_COLUMNS
from dex_celery.store.repository import Store
from dex_celery.store.schema import audit_log, messages, tool_calls
from dex_celery.store.statement_trace import trace
from dex_celery.store.values import NewCall, Outcome, OutcomeRow
from dex_celery.store.views import OperatorViews
from tests.support.stores.databases import POSTGRESQL, SQLITE, database_url
from tests.support.stores.store_rig import Clock, new_call

SIGNER = Signer.generate()
WRITE = EffectClass.NON_IDEMPOTENT_WRITE


@pytest.fixture(params=[SQLITE, POSTGRESQL])
def twins(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two stores on two databases of one kind: the batch's, and the one-at-a-time's."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        database_url(request.param, tmp_path / "a") as one,
        database_url(request.param, tmp_path / "b") as other,
    ):
        stores = (
            Store(one, clock=Clock(), signer=SIGNER),
            Store(other, clock=Clock(), signer=SIGNER),
        )
        for store in stores:
            store.create_schema()
        yield stores
        for store in stores:
            store.engine.dispose()


def budgeted(key: str, **policy: Any) -> NewCall:
    call = CallKey.parse(key)
    charge = charge_of(
        Budget("refunds", limit=3), {}, session_id=call.session_id, principal=None, tool_name="echo"
    )
    return replace(new_call(key, **policy), charges=(charge,))


def attempt_log(attempt: int, at: float) -> str:
    return json.dumps(
        [{"attempt": attempt, "state": "ok", "owner": "w@h:1", "claimed_at": at, "ended_at": at}]
    )


def prepare(store: Store) -> list[OutcomeRow]:
    """The calls, the writes that come before the batch, and the batch's rows."""
    store.insert_calls(
        [
            new_call("s/t/ok1"),
            new_call("s/t/ok2", effect=EffectClass.IDEMPOTENT_WRITE),
            new_call("s/t/boom"),
            budgeted("s/t/spent", effect=WRITE, requires_approval=False),
            budgeted("s/t/lost", effect=WRITE, requires_approval=False),
            new_call("s/t/done"),
            new_call("s/t/wait", effect=EffectClass.UNCLASSIFIED),
            new_call("s/t/twice"),
            new_call("s/t/claimed", effect=WRITE, requires_approval=False),
            new_call("s/t/unclaimed", effect=WRITE, requires_approval=False),
            new_call("s/t/late"),
        ],
        epoch="e",
    )
    now = store.clock()
    assert store.claim_write("s/t/lost", 1, fence="f1", owner="w@h:1", now=now)
    assert store.claim_write("s/t/claimed", 1, fence="f2", owner="w@h:1", now=now)
    assert store.record_outcome("s/t/done", Outcome(CallStatus.FAILED, "first writer"))
    store.record_late_result("s/t/late", '{"attempt": 1}')

    def row(key: str, outcome: Outcome) -> OutcomeRow:
        return OutcomeRow(CallKey.parse(key), "echo", '{"q":1}', outcome)

    log = attempt_log(1, now)
    return [
        row("s/t/ok1", Outcome(CallStatus.SUCCEEDED, "", '"A"', 1, log, decided_at=now + 1)),
        row("s/t/boom", Outcome(CallStatus.FAILED, "no such order", None, 1, log)),
        row("s/t/done", Outcome(CallStatus.SUCCEEDED, "", '"late"', 1, log)),  # guarded out
        row("s/t/spent", Outcome(CallStatus.SUCCEEDED, "", '"paid"', 1, log)),
        row("s/t/wait", Outcome(CallStatus.SUCCEEDED, "", '"no"', 1)),  # guarded out
        row("s/t/lost", Outcome(CallStatus.OUTCOME_UNKNOWN, "the worker was lost", None, 1, log)),
        row("s/t/ghost", Outcome(CallStatus.SUCCEEDED, "", '"no"', 1)),  # no such call
        row("s/t/twice", Outcome(CallStatus.SUCCEEDED, "", '"first"', 1, log)),
        row(
            "s/t/claimed",  # "did not run", but its write was claimed: guarded out
            Outcome(CallStatus.FAILED, "did not run", attempts=1, did_not_run=True),
        ),
        row("s/t/unclaimed", Outcome(CallStatus.FAILED, "did not run", did_not_run=True)),
        row("s/t/twice", Outcome(CallStatus.FAILED, "second", None, 2, log)),  # guarded out
        row("s/t/ok2", Outcome(CallStatus.SUCCEEDED, "", '"B"', 2, attempt_log(2, now))),
        row("s/t/late", Outcome(CallStatus.SUCCEEDED, "", '"L"', 1, log)),
    ]


def state(store: Store) -> dict[str, Any]:
    """Every call's columns, TOOL messages, counts and audit entries (per call, in order)."""
    with store.engine.connect() as conn:
        calls = {
            r["key"]: dict(r)
            for r in conn.execute(select(tool_calls).order_by(tool_calls.c.key)).mappings()
        }
        tool = select(messages.c.turn_id, messages.c.tool_call_id, messages.c.tool_output)
        said = sorted(tuple(r) for r in conn.execute(tool.where(messages.c.role == "tool")))
        entries: dict[str | None, list[tuple[str, float, Any]]] = {}
        query = select(audit_log).order_by(audit_log.c.writer, audit_log.c.seq)
        for r in conn.execute(query).mappings():
            entries.setdefault(r["call_key"], []).append(
                (r["kind"], r["at"], json.loads(r["body"]))
            )
    counts = sorted(OperatorViews(store).count_by_outcome(), key=str)
    return {"calls": calls, "messages": said, "counts": counts, "entries": entries}


def test_a_mixed_batch_ends_each_call_as_one_at_a_time_would(twins: tuple[Store, Store]) -> None:
    batched, alone = twins
    seen: list[str] = []
    trace(batched.engine, lambda sql, times: seen.extend([sql] * times))
    batched.engine.dispose()  # its connections from now on are traced
    rows = prepare(batched)
    assert prepare(alone) == rows
    for store in twins:
        store.clock.now += 5  # type: ignore[attr-defined]

    del seen[:]
    batched.record_outcomes(rows)
    for row in rows:
        alone.record_outcomes([row])

    got, want = state(batched), state(alone)
    assert got == want
    calls = got["calls"]
    ended = {k.split("/")[-1]: (c["status"], c["result"] or c["error"]) for k, c in calls.items()}
    assert ended == {
        "ok1": ("succeeded", '"A"'),
        "ok2": ("succeeded", '"B"'),
        "boom": ("failed", "no such order"),
        "spent": ("succeeded", '"paid"'),
        "lost": ("outcome_unknown", "the worker was lost"),
        "done": ("failed", "first writer"),
        "wait": ("awaiting_approval", None),
        "twice": ("succeeded", '"first"'),
        "claimed": ("pending", None),
        "unclaimed": ("failed", "did not run"),
        "late": ("succeeded", '"L"'),
    }
    assert calls["s/t/ok1"]["finished_at"] == batched.clock() - 4  # type: ignore[operator]
    assert calls["s/t/late"]["late_result"] == '{"attempt": 1}'
    kinds = {key: [kind for kind, _, _ in e] for key, e in got["entries"].items()}
    assert kinds["s/t/spent"][-1] == "budget_spent"
    assert kinds["s/t/lost"][-1] == "budget_held"
    assert "attempt_started" in kinds["s/t/lost"]  # its write fence's claim, as RETURNING gave it
    assert "outcome" not in kinds["s/t/claimed"] and "s/t/ghost" not in kinds
    assert kinds["s/t/twice"].count("outcome") == 1
    for store in twins:
        findings = verify_database(store, SIGNER.verifier())
        assert findings.ok, findings.lines()

    updates = [s for s in seen if s.lstrip().upper().startswith(("UPDATE", "WITH"))]
    batch_updates = [s for s in updates if "dex_tool_calls" in s]
    if batched.engine.dialect.name == "postgresql":
        # The batch's one joined UPDATE, and "did not run"'s own two (written one by one).
        assert sum(s.lstrip().startswith("WITH") for s in batch_updates) == 1
        assert len(batch_updates) == 3
    else:
        assert len(batch_updates) == 12  # one per distinct key, "did not run"'s two among them
    entry_inserts = [s for s in seen if s.startswith("INSERT INTO dex_audit_log")]
    assert len(entry_inserts) == 2  # the batch's, and the "did not run" that ended its call


def test_a_batch_of_one_and_a_batch_of_one_key_twice(twins: tuple[Store, Store]) -> None:
    """The smallest batches: one row (the one-row UPDATE on both databases), and a key twice."""
    store, _ = twins
    store.insert_calls([new_call("s/t/a"), new_call("s/t/b")], epoch="e")

    def row(key: str, result: str) -> OutcomeRow:
        return OutcomeRow(
            CallKey.parse(key), "echo", "{}", Outcome(CallStatus.SUCCEEDED, "", result)
        )

    store.record_outcomes([row("s/t/a", '"1"')])
    store.record_outcomes([row("s/t/b", '"2"'), row("s/t/b", '"3"'), row("s/t/a", '"4"')])
    a, b = store.get_call("s/t/a"), store.get_call("s/t/b")
    assert a is not None and b is not None
    assert (a.result, b.result) == ('"1"', '"2"')
    _calls, history = store.snapshot("s")
    assert sorted(m.tool_output or "" for m in history if m.tool_output) == ['"1"', '"2"']


def test_entries_past_one_statement_s_parameters_go_in_several(twins: tuple[Store, Store]) -> None:
    """A transaction with more entries than one INSERT's parameters hold (`MAX_PARAMETERS`):
    several statements in the same transaction, one whole chain."""
    store, _ = twins
    most = store_many_rows.MAX_PARAMETERS // len(ENTRY_COLUMNS)
    entries = [Entry(AuditKind.THAW, {"n": i}) for i in range(most + 10)]
    with store.engine.begin() as conn:
        appended = store.audit.append(conn, *entries)
    appended.committed()
    with store.engine.connect() as conn:
        bodies = [json.loads(b) for (b,) in conn.execute(select(audit_log.c.body))]
    assert sorted(b["n"] for b in bodies) == list(range(most + 10))
    findings = verify_database(store, SIGNER.verifier())
    assert findings.ok, findings.lines()
