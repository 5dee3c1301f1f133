"""The audit log against direct tampering with the database (S13.4.1-S13.4.5, docs/audit.md).

Each test records a small history through the store (a batch of outcomes as the recorder writes
them, an approval, a rejection, an expiry, a late result, a call still waiting), checks that
`audit verify` passes on it, then changes the database behind the store's back, as someone
holding the database could, and checks that verify names what changed. On a fresh SQLite file
and on the running PostgreSQL (a schema per test).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, select, text, update

from dex_celery.audit.check import FindingClass, Findings
from dex_celery.audit.entries import Chained, entry_hash
from dex_celery.audit.export import export, verify_file
from dex_celery.audit.keys import Signer
from dex_celery.audit.prune import prune_audit
from dex_celery.audit.verify import verify_database
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass
from dex_celery.model.records import ApprovalDecision
from dex_celery.store.repository import Store
from dex_celery.store.schema import audit_heads, audit_log, tool_calls
from dex_celery.store.values import Outcome, OutcomeRow
from tests.support.stores.store_rig import Clock, new_call
from tests.support.stores.store_rig import url as url

SIGNER = Signer.generate()
VERIFIER = SIGNER.verifier()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(url: str, clock: Clock) -> Iterator[Store]:
    store = Store(url, clock=clock, signer=SIGNER)
    store.create_schema()
    yield store
    store.engine.dispose()


def history(store: Store, clock: Clock) -> None:
    """Calls in every kind of ending the store records."""
    approval = dict(effect=EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=60.0)
    store.insert_calls(
        [new_call(f"s/t/r{i}") for i in range(4)]
        + [new_call("s/t/ok", **approval), new_call("s/t/no", **approval)]
        + [new_call("s/t/late", **approval), new_call("s/t/wait", **approval)],
        epoch="e",
    )
    clock.now += 1
    log = json.dumps(
        [
            {
                "attempt": 1,
                "state": "succeeded",
                "owner": "w1@h:42",
                "claimed_at": clock.now - 0.5,
                "ended_at": clock.now,
            }
        ]
    )
    store.record_outcomes(
        [
            OutcomeRow(
                CallKey.parse(f"s/t/r{i}"),
                "echo",
                '{"q":1}',
                Outcome(CallStatus.SUCCEEDED, "", f'"r{i}"', 1, log),
            )
            for i in range(4)
        ]
    )
    assert store.decide(
        "s/t/ok", ApprovalDecision("approved", "ann", clock.now, "fine"), now=clock.now
    )
    store.record_outcome("s/t/ok", Outcome(CallStatus.FAILED, "boom", None, 1, log))
    rejected = ApprovalDecision("rejected", "bob", clock.now, None)
    assert store.record_outcome(
        "s/t/no",
        Outcome(CallStatus.REJECTED, "rejected by bob"),
        from_statuses=(CallStatus.AWAITING_APPROVAL,),
        decision=rejected,
    )
    expired = ApprovalDecision("expired", "system", clock.now, None)
    assert store.record_outcome(
        "s/t/late",
        Outcome(CallStatus.REJECTED, "the deadline passed"),
        from_statuses=(CallStatus.AWAITING_APPROVAL,),
        decision=expired,
    )
    store.record_late_result("s/t/r0", '{"late": true}')


def verified(store: Store) -> Findings:
    return verify_database(store, VERIFIER)


def only(findings: Findings, kind: FindingClass) -> str:
    assert kind in findings.first, findings.lines()
    return findings.first[kind]


def chain_of(store: Store, key: str) -> list[Chained]:
    """The chain holding the entries of call `key`, in order."""
    with store.engine.connect() as conn:
        writer = conn.execute(
            select(audit_log.c.writer).where(audit_log.c.call_key == key)
        ).scalar()
        rows = conn.execute(
            select(audit_log).where(audit_log.c.writer == writer).order_by(audit_log.c.seq)
        ).mappings()
        return [Chained.of(r) for r in rows]


def test_an_untouched_history_verifies(store: Store, clock: Clock) -> None:
    """S13.4.1, S13.4.3: every decision is an entry, and an untouched log has no finding."""
    history(store, clock)
    findings = verified(store)
    assert findings.ok, findings.lines()
    with store.engine.connect() as conn:
        kinds = {r[0] for r in conn.execute(select(audit_log.c.kind))}
        secrets = conn.execute(select(audit_log.c.body)).scalars().all()
    assert kinds >= {
        "call_requested",
        "approval_asked",
        "approval_decided",
        "approval_expired",
        "attempt_claimed",
        "attempt_ended",
        "outcome",
        "late_result",
    }
    assert not any('"r1"' in body or "boom" in body for body in secrets), "values, not digests"


def test_an_updated_outcome_is_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    with store.engine.begin() as conn:
        conn.execute(
            update(tool_calls)
            .where(tool_calls.c.key == "s/t/r2")
            .values(status="failed", error="no")
        )
    line = only(verified(store), FindingClass.RECORD)
    assert "s/t/r2" in line and "'failed'" in line and "succeeded" in line, line


def test_an_updated_result_is_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    with store.engine.begin() as conn:
        conn.execute(
            update(tool_calls).where(tool_calls.c.key == "s/t/r1").values(result='"other"')
        )
    assert "s/t/r1" in only(verified(store), FindingClass.RECORD)


def test_a_deleted_approval_is_named(store: Store, clock: Clock) -> None:
    """The waiting call's row, deleted, and the decision on another, wiped."""
    history(store, clock)
    with store.engine.begin() as conn:
        conn.execute(delete(tool_calls).where(tool_calls.c.key == "s/t/wait"))
        conn.execute(
            update(tool_calls)
            .where(tool_calls.c.key == "s/t/ok")
            .values(decision=None, decided_by=None)
        )
    findings = verified(store)
    assert findings.counts[FindingClass.RECORD] == 2, findings.lines()
    line = " ".join(findings.lines())
    assert "s/t/wait is gone from the records" in line or "s/t/ok" in line


def test_a_deleted_call_row_is_named_with_the_chains_last_word(store: Store, clock: Clock) -> None:
    history(store, clock)
    with store.engine.begin() as conn:
        conn.execute(delete(tool_calls).where(tool_calls.c.key == "s/t/wait"))
    line = only(verified(store), FindingClass.RECORD)
    assert "s/t/wait is gone from the records" in line and "approval_asked" in line, line


def test_an_inserted_call_row_is_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    with store.engine.begin() as conn:
        row = conn.execute(select(tool_calls).where(tool_calls.c.key == "s/t/r3")).mappings().one()
        conn.execute(
            tool_calls.insert().values({**row, "key": "s/t/forged", "tool_call_id": "forged"})
        )
    assert "s/t/forged has no entry" in only(verified(store), FindingClass.RECORD)


def test_two_swapped_entries_are_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    chain = chain_of(store, "s/t/r1")
    a, b = chain[1], chain[2]
    with store.engine.begin() as conn:
        conn.execute(
            update(audit_log)
            .where(audit_log.c.writer == a.writer)
            .where(audit_log.c.seq == a.seq)
            .values(seq=-1)
        )
        conn.execute(
            update(audit_log)
            .where(audit_log.c.writer == b.writer)
            .where(audit_log.c.seq == b.seq)
            .values(seq=a.seq)
        )
        conn.execute(
            update(audit_log)
            .where(audit_log.c.writer == a.writer)
            .where(audit_log.c.seq == -1)
            .values(seq=b.seq)
        )
    line = only(verified(store), FindingClass.REORDERED)
    assert f"{a.writer}#{a.seq}" in line and f"entry #{b.seq}" in line, line


def test_an_edited_entry_is_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    entry = next(
        e for e in chain_of(store, "s/t/r2") if e.call_key == "s/t/r2" and e.kind == "outcome"
    )
    with store.engine.begin() as conn:
        conn.execute(
            update(audit_log)
            .where(audit_log.c.writer == entry.writer)
            .where(audit_log.c.seq == entry.seq)
            .values(body=entry.body.replace("succeeded", "failed"))
        )
    assert f"{entry.writer}#{entry.seq}" in only(verified(store), FindingClass.EDITED)


def test_an_entry_rewritten_with_its_hashes_fails_its_signature(store: Store, clock: Clock) -> None:
    """Without the key, recomputing every hash after an edit still shows (S13.4.2)."""
    history(store, clock)
    chain = chain_of(store, "s/t/r0")
    target = next(e for e in chain if e.call_key == "s/t/r0" and e.kind == "outcome")
    prev = target.prev
    with store.engine.begin() as conn:
        for e in chain[chain.index(target) :]:
            body = e.body.replace("succeeded", "failed") if e is target else e.body
            digest = entry_hash(prev, e.writer, e.seq, e.at, e.kind, e.call_key, e.session_id, body)
            conn.execute(
                update(audit_log)
                .where(audit_log.c.writer == e.writer)
                .where(audit_log.c.seq == e.seq)
                .values(body=body, prev=prev, hash=digest)
            )
            prev = digest
        conn.execute(
            update(audit_heads).where(audit_heads.c.writer == target.writer).values(hash=prev)
        )
        conn.execute(update(tool_calls).where(tool_calls.c.key == "s/t/r0").values(status="failed"))
    findings = verified(store)
    assert target.writer in only(findings, FindingClass.SIGNATURE)
    assert FindingClass.EDITED not in findings.first and FindingClass.RECORD not in findings.first


def test_an_inserted_entry_is_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    last = chain_of(store, "s/t/r2")[-1]
    forged = {
        **last.as_dict(),
        "seq": last.seq + 1,
        "prev": last.hash,
        "signature": None,
        "key_id": None,
    }
    forged["hash"] = entry_hash(
        last.hash,
        last.writer,
        last.seq + 1,
        last.at,
        last.kind,
        last.call_key,
        last.session_id,
        last.body,
    )
    with store.engine.begin() as conn:
        conn.execute(audit_log.insert().values(**forged))
    assert f"{last.writer}#{last.seq + 1}" in only(verified(store), FindingClass.INSERTED)


def test_an_entry_inserted_in_the_middle_is_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    chain = chain_of(store, "s/t/r2")
    middle = chain[2]
    with store.engine.begin() as conn:
        for e in reversed(chain[2:]):
            conn.execute(
                update(audit_log)
                .where(audit_log.c.writer == e.writer)
                .where(audit_log.c.seq == e.seq)
                .values(seq=e.seq + 1)
            )
        conn.execute(audit_log.insert().values(**{**chain[1].as_dict(), "seq": middle.seq}))
    findings = verified(store)
    assert f"{middle.writer}#{middle.seq}" in " ".join(findings.lines()), findings.lines()
    assert not findings.ok


def test_a_cut_tail_is_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    chain = chain_of(store, "s/t/r1")
    cut = chain[-2:]
    with store.engine.begin() as conn:
        conn.execute(
            delete(audit_log)
            .where(audit_log.c.writer == cut[0].writer)
            .where(audit_log.c.seq >= cut[0].seq)
        )
    line = only(verified(store), FindingClass.DELETED)
    assert f"{cut[0].writer}#{cut[0].seq}..#{cut[-1].seq}" in line, line


def test_a_deleted_middle_entry_is_named(store: Store, clock: Clock) -> None:
    history(store, clock)
    gone = chain_of(store, "s/t/r1")[1]
    with store.engine.begin() as conn:
        conn.execute(
            delete(audit_log)
            .where(audit_log.c.writer == gone.writer)
            .where(audit_log.c.seq == gone.seq)
        )
    assert f"{gone.writer}#{gone.seq}" in only(verified(store), FindingClass.DELETED)


def test_a_failed_transaction_leaves_a_whole_chain(store: Store, clock: Clock) -> None:
    """S13.4.2: the chain moves on only after a commit; a rolled-back append is never built on."""
    history(store, clock)
    with pytest.raises(RuntimeError), store.engine.begin() as conn:
        store.audit.append(
            conn,
            *__import__("dex_celery.audit.call_entries", fromlist=["x"]).requested(
                {
                    "key": "s/t/x",
                    "session_id": "s",
                    "tool_name": "echo",
                    "arguments": "{}",
                    "policy": "{}",
                    "status": "pending",
                    "requested_at": clock.now,
                }
            ),
        )
        raise RuntimeError("the transaction fails after the append")
    store.insert_calls([new_call("s/t/after")], epoch="e")
    findings = verified(store)
    assert findings.ok, findings.lines()


def test_export_verifies_offline_and_a_changed_byte_fails(
    store: Store, clock: Clock, tmp_path: Path
) -> None:
    """S13.4.4: an export checks with the public key alone; one byte changed fails it."""
    history(store, clock)
    for scope in ({}, {"session_id": "s"}, {"since": clock.now - 0.5}):
        path = tmp_path / "export.jsonl"
        with path.open("w") as out:
            assert export(store, SIGNER, out, **scope) > 0  # type: ignore[arg-type]
        findings = verify_file(path, VERIFIER)
        assert findings.ok, (scope, findings.lines())
        data = path.read_bytes()
        at = data.index(b"succeeded")
        path.write_bytes(data[:at] + b"Succeeded" + data[at + 9 :])
        assert not verify_file(path, VERIFIER).ok
        path.unlink()
    other = Signer.generate().verifier()
    with (tmp_path / "e.jsonl").open("w") as out:
        export(store, SIGNER, out)
    assert FindingClass.SIGNATURE in verify_file(tmp_path / "e.jsonl", other).first


def test_prune_leaves_a_checkpoint_and_the_archive_verifies_alone(
    store: Store, clock: Clock, tmp_path: Path
) -> None:
    """S13.4.5: after the log is cut, verify passes from the signed checkpoint on; the cut
    entries' archive verifies on its own, and a cut archive does not."""
    history(store, clock)
    clock.now += 100
    store.insert_calls([new_call("s/t/new")], epoch="e")  # a chain continues after the cut
    archive = tmp_path / "audit.jsonl"
    with store.engine.connect() as conn:
        cutoff = conn.execute(text("SELECT max(at) FROM dex_audit_log")).scalar() - 0.001
    cut = prune_audit(store, cutoff=cutoff, archive=archive)
    assert cut > 0
    findings = verified(store)
    assert findings.ok, findings.lines()
    alone = verify_file(archive, VERIFIER)
    assert alone.ok and alone.entries == cut, alone.lines()
    lines = archive.read_text().splitlines()
    archive.write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    assert not verify_file(archive, VERIFIER).ok


def test_bound_approvals_edits_rewaits_budget_and_freeze_holds_verify(
    store: Store, clock: Clock
) -> None:
    """S13.4.1: the decisions of the guardrails (S13.1-S13.3) are entries too, and a record
    they moved still agrees with the chain; an UPDATE undoing one shows."""
    from dex_celery.model.freeze import FreezeMode
    from dex_celery.store.approval_binding import ArgumentsEdit
    from dex_celery.store.freezes import Hold, WriteFreezes

    approval = dict(effect=EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=60.0)
    store.insert_calls(
        [new_call("g/t/edit", **approval), new_call("g/t/budget"), new_call("g/t/frozen")],
        epoch="e",
    )
    clock.now += 1
    edit = ArgumentsEdit('{"q":2}', None, "d" * 64, "{}")
    ann = ApprovalDecision("approved", "ann", clock.now, None)
    assert store.approve_bound("g/t/edit", ann, now=clock.now, epoch="e", binding="b1", edit=edit)
    clock.now += 1
    assert store.rewait(
        "g/t/edit",
        approved="b1",
        reason="redeployed",
        deadline=clock.now + 60,
        definition_digest="x" * 64,
        arguments_digest=None,
    )
    assert store.hold_for_budget("g/t/budget", "over", deadline=clock.now + 60)
    freezes = WriteFreezes(lambda: store.engine, store.audit)
    (frozen,) = freezes.begin(["*"], FreezeMode.HOLD, "incident", "ops", clock.now)
    held = freezes.hold(
        "g/t/frozen", frozen, deadline=clock.now + 60, may_have_run=False, now=clock.now
    )
    assert held is Hold.HELD
    clock.now += 1
    freezes.end(None, "ops", clock.now)
    assert [h.record.key for h in freezes.release([], clock.now, lambda _h: None)] == ["g/t/frozen"]
    findings = verified(store)
    assert findings.ok, findings.lines()
    with store.engine.connect() as conn:
        kinds = {r[0] for r in conn.execute(select(audit_log.c.kind))}
    assert {"approval_edited", "freeze", "thaw", "approval_asked"} <= kinds
    with store.engine.begin() as conn:
        conn.execute(
            update(tool_calls).where(tool_calls.c.key == "g/t/edit").values(status="pending")
        )
    assert "g/t/edit" in only(verified(store), FindingClass.RECORD)


def budget_moves(store: Store, key: str | None = None) -> list[tuple[str, str | None, dict]]:
    """The budget entries (kind, call, body), in the order appended."""
    query = (
        select(audit_log.c.kind, audit_log.c.call_key, audit_log.c.body)
        .where(audit_log.c.kind.like("budget_%"))
        .order_by(audit_log.c.at, audit_log.c.writer, audit_log.c.seq)
    )
    if key is not None:
        query = query.where(audit_log.c.call_key == key)
    with store.engine.connect() as conn:
        return [(r.kind, r.call_key, json.loads(r.body)) for r in conn.execute(query)]


def test_budget_moves_are_entries(store: Store, clock: Clock) -> None:
    """S13.4.1, S13.1.3: a budgeted call's charge is `budget_reserved` with its request, then
    spent, held or released in the transaction that records its outcome (the recorder's batch,
    a single outcome, an approver's reject, an expiry), and reconciliation's verdict settles a
    held one; each entry names the budget, scope, charge and limit. Calls without charges have
    none, and the log still verifies."""
    from dataclasses import replace

    from dex_celery.model.budgets import Budget, BudgetScope, charge_of
    from dex_celery.store.budgets import DID_NOT_RUN, WENT_THROUGH
    from dex_celery.store.unknowns import UnknownOutcomes

    refunds = Budget("refunds", limit=3)
    cents = Budget("cents", limit=900, measure="q", scope=BudgetScope.DEPLOYMENT, window="day")

    def budgeted(key: str, **policy: object) -> object:
        call = CallKey.parse(key)
        charges = tuple(
            charge_of(b, {"q": 7}, session_id=call.session_id, principal=None, tool_name="echo")
            for b in (refunds, cents)
        )
        return replace(new_call(key, **policy), charges=charges)  # type: ignore[arg-type]

    approval = dict(effect=EffectClass.NON_IDEMPOTENT_WRITE, approval_timeout=60.0)
    keys = ["ok", "boom", "unknown", "lost", "not-run", "no", "late"]
    calls = [budgeted(f"b/t/{k}") for k in keys[:5]]
    calls += [budgeted("b/t/no", **approval), budgeted("b/t/late", **approval)]
    store.insert_calls([*calls, new_call("b/t/free")], epoch="e")  # type: ignore[list-item]
    reserved = budget_moves(store)
    assert {k for kind, k, _ in reserved if kind == "budget_reserved"} == {f"b/t/{k}" for k in keys}
    assert len(reserved) == 2 * len(keys)
    assert {
        "budget": "cents",
        "scope": "deployment",
        "charge": 7,
        "limit": 900,
        "measure": "q",
        "window": 86400.0,
    } in [body for _, key, body in reserved if key == "b/t/ok"]

    clock.now += 1

    def row(key: str, status: CallStatus) -> OutcomeRow:
        return OutcomeRow(CallKey.parse(key), "echo", '{"q":7}', Outcome(status, "", None, 1))

    store.record_outcomes(  # the recorder's batch
        [
            row("b/t/ok", CallStatus.SUCCEEDED),
            row("b/t/boom", CallStatus.FAILED),
            row("b/t/unknown", CallStatus.OUTCOME_UNKNOWN),
            row("b/t/lost", CallStatus.OUTCOME_UNKNOWN),
            row("b/t/free", CallStatus.SUCCEEDED),
        ]
    )
    assert store.record_outcome(  # the sweeper: no claim in SQL, so it did not run
        "b/t/not-run", Outcome(CallStatus.FAILED, "did not run", did_not_run=True)
    )
    assert store.record_outcome(
        "b/t/no",
        Outcome(CallStatus.REJECTED, "rejected by bob"),
        from_statuses=(CallStatus.AWAITING_APPROVAL,),
        decision=ApprovalDecision("rejected", "bob", clock.now, None),
    )
    assert store.record_outcome(
        "b/t/late",
        Outcome(CallStatus.REJECTED, "the deadline passed"),
        from_statuses=(CallStatus.AWAITING_APPROVAL,),
        decision=ApprovalDecision("expired", "system", clock.now, None),
    )
    settled = {
        key: kind
        for kind, key, body in budget_moves(store)
        if kind != "budget_reserved" and body["budget"] == "refunds"
    }
    assert settled == {
        "b/t/ok": "budget_spent",
        "b/t/boom": "budget_released",
        "b/t/unknown": "budget_held",
        "b/t/lost": "budget_held",
        "b/t/not-run": "budget_released",
        "b/t/no": "budget_released",
        "b/t/late": "budget_released",
    }
    assert not budget_moves(store, "b/t/free")
    (_, _, held), _cents = budget_moves(store, "b/t/unknown")[2:]
    assert held == {
        "budget": "refunds",
        "scope": "session:b",
        "charge": 1,
        "limit": 3,
        "measure": "count",
        "window": 0.0,
        "status": "outcome_unknown",
    }

    clock.now += 1
    repo = UnknownOutcomes(store)
    for key, verdict in (("b/t/unknown", WENT_THROUGH), ("b/t/lost", DID_NOT_RUN)):
        record = store.get_call(key)
        assert record is not None and repo.surface(record, now=clock.now)
        assert repo.report(record, f"{key}: {verdict}", now=clock.now, verdict=verdict)
    reconciled = [(kind, body.get("verdict")) for kind, _, body in budget_moves(store, "b/t/lost")]
    assert reconciled[-2:] == [("budget_released", DID_NOT_RUN)] * 2
    reconciled = [
        (kind, body.get("verdict")) for kind, _, body in budget_moves(store, "b/t/unknown")
    ]
    assert reconciled[-2:] == [("budget_spent", WENT_THROUGH)] * 2
    findings = verified(store)
    assert findings.ok, findings.lines()
