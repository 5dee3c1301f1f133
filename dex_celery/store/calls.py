"""Persistence of tool-call records: insert, end (once), claim, decide, read.

Every write that ends a call is a conditional update (`WHERE status IN (...)`) in the same
transaction as its TOOL message, so an outcome lands once however many writers (worker, sweeper,
approver) race to record it, and a refused write leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    insert,
    or_,
    select,
    update,
)

from dex_celery.audit import call_entries
from dex_celery.audit.entries import Entry
from dex_celery.model.budgets import BudgetCharge, charges_json
from dex_celery.model.ids import CallKey, validate_id
from dex_celery.model.list_limits import check_list_limit
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass, PolicySnapshot
from dex_celery.model.records import (
    ApprovalDecision,
    ToolCallRecord,
)
from dex_celery.store.base import StoreBase
from dex_celery.store.budgets import insert_charges
from dex_celery.store.commit import transaction
from dex_celery.store.counts import Ended, count_ended
from dex_celery.store.dialect import IN_CHUNK, insert_many_ignore
from dex_celery.store.hot import driver_cursor, hot_statements
from dex_celery.store.hot_request import REQUEST_COLUMNS, request_statements
from dex_celery.store.repeat_guards import RepeatCheck, held_back_by, pass_guard, take_guard
from dex_celery.store.rows import (
    approval_values,
    call_record,
    tool_message_row,
)
from dex_celery.store.schema import messages, tool_calls
from dex_celery.store.sessions import session_default
from dex_celery.store.values import Admission, NewCall, Outcome, OutcomeRow


class CallRecords(StoreBase):
    """The tool-call aggregate of `Store`."""

    # --- requests ------------------------------------------------------------------------------

    def insert_calls(
        self,
        new_calls: Sequence[NewCall],
        *,
        epoch: str,
        check: Callable[[NewCall, ToolCallRecord], None] | None = None,
        repeats: RepeatCheck | None = None,
    ) -> list[tuple[ToolCallRecord, bool]]:
        """Record new calls in one transaction; a key already recorded returns its record (S2.3).

        Returns (record, created) per request, in order. `check(new, recorded)` is called for
        each request whose key is recorded already; what it raises rolls the whole batch back.
        `repeats`: the repeat guard (S5.4) for new calls whose policy has it, in the same
        transaction (`store/repeat_guards.py`).
        """
        now = self.clock()
        keys = [new.key.key for new in new_calls]
        hot = request_statements(self.engine)
        # `transaction`: a connection lost during the COMMIT raises `CommitUnconfirmed`, since
        # the calls may then be recorded (and would run); the request says so (S11.2).
        with transaction(self.engine) as conn:
            # Insert first, read back only what the insert skipped: a request is new almost
            # always, so the common path is one INSERT, not a SELECT before it. (A known call's
            # session exists already, so reading its default below writes nothing.)
            defaults: dict[str, EffectClass | None] = {}
            rows: list[dict[str, Any]] = []
            batched: set[str] = set()
            charged: dict[str, tuple[BudgetCharge, ...]] = {}
            for new in new_calls:
                if new.key.key in batched:
                    continue
                batched.add(new.key.key)
                sid = new.key.session_id
                if sid not in defaults:
                    defaults[sid] = session_default(conn, sid, now, hot)
                admission = new.resolve(defaults[sid], now)
                snapshot = admission.policy
                rows.append(
                    dict(
                        key=new.key.key,
                        session_id=sid,
                        turn_id=new.key.turn_id,
                        tool_call_id=new.key.tool_call_id,
                        tool_name=new.tool_name,
                        arguments=new.arguments,
                        sealed_arguments=new.sealed,
                        effect=snapshot.effect.value,
                        requires_approval=int(snapshot.requires_approval),
                        policy=snapshot.to_json(),
                        status=admission.status.value,
                        attempts=0,
                        ledger_epoch=epoch,
                        requested_at=now,
                        approval_deadline=admission.approval_deadline,
                        repeat_digest=new.repeat_digest if snapshot.repeat_guard else None,
                        trace_context=new.trace_context,
                    )
                )
                if new.charges:  # only then: the common request keeps its compiled insert
                    rows[-1]["budgets"] = charges_json(new.charges)
                    charged[new.key.key] = new.charges
            if charged:  # one batch, one set of columns
                for row in rows:
                    row.setdefault("budgets", None)
            if charged or any(r["status"] == CallStatus.AWAITING_APPROVAL.value for r in rows):
                _keep_digests(rows, new_calls)
            if hot is not None and len(rows) == 1 and tuple(rows[0]) == REQUEST_COLUMNS:
                # One call, the common request: its driver SQL (`store/hot_request.py`).
                inserted = hot.insert_call.first(conn, rows[0])
                created = {str(inserted[0])} if inserted is not None else set()
            else:
                created = insert_many_ignore(conn, tool_calls, rows)
            for key in created & charged.keys():
                insert_charges(conn, key, charged[key], now)
            if repeats is not None:
                definitions = {n.key.key: n.definition_digest for n in new_calls}
                self._guard_repeats(
                    conn, [r for r in rows if r["key"] in created], repeats, now, definitions
                )
            # Recorded before, or by a concurrent request of the same calls that won (S2.3).
            known = self._calls_by_key(conn, [r["key"] for r in rows if r["key"] not in created])
            if check is not None:
                for new in new_calls:
                    if new.key.key in known:
                        check(new, known[new.key.key])
            entries: list[Entry] = []
            for r in rows:
                if r["key"] in created:
                    entries += call_entries.requested(r)
                    if r["key"] in charged:  # in the same INSERT as the rest (S13.4.1)
                        entries += call_entries.budget_reserved(r, charged[r["key"]])
            appended = self.audit.append(conn, *entries)
        appended.committed()
        fresh = {r["key"]: call_record(r) for r in rows if r["key"] in created}
        out: list[tuple[ToolCallRecord, bool]] = []
        for key in keys:
            # The first mention creates the call; a repeat in the same batch is the same call.
            out.append((fresh[key], True) if key in fresh else (known[key], False))
            fresh.pop(key, None)
            known.setdefault(key, out[-1][0])
        return out

    def _guard_repeats(
        self,
        conn: Connection,
        rows: list[dict[str, Any]],
        repeats: RepeatCheck,
        now: float,
        definitions: dict[str, str | None],
    ) -> None:
        """Run the repeat guard for the new guarded calls; a held-back call's row (and `rows`'s
        dict of it) becomes what `repeats.hold` decides. Slots are taken in one order (session,
        digest) so two batches cannot deadlock on them."""
        guarded = sorted(
            (r for r in rows if r["repeat_digest"] is not None),
            key=lambda r: (r["session_id"], r["repeat_digest"], r["key"]),
        )
        for row in guarded:
            policy = PolicySnapshot.from_json(row["policy"])
            hazard = pass_guard(
                conn,
                row["session_id"],
                row["repeat_digest"],
                row["key"],
                repeats.judge,
                policy.repeat_window,
            )
            if hazard is None:
                continue
            admitted = Admission(policy, CallStatus(row["status"]), row["approval_deadline"])
            held = repeats.hold(admitted, hazard, now)
            values = dict(
                status=held.status.value,
                approval_deadline=held.approval_deadline,
                repeat_of=hazard.earlier,
                repeat_reason=hazard.reason,
                # What the approval of a held-back call is bound to (S13.3).
                arguments_digest=row["repeat_digest"],
                definition_digest=definitions.get(row["key"]),
            )
            conn.execute(update(tool_calls).where(tool_calls.c.key == row["key"]).values(**values))
            row.update(values)

    def take_repeat_slot(self, record: ToolCallRecord) -> None:
        """An approved held-back call becomes the holder of its slot (`store/repeat_guards.py`)."""
        if record.repeat_digest is None:
            return
        with self.engine.begin() as conn:
            take_guard(conn, record.session_id, record.repeat_digest, record.key)

    def held_back_by(self, earlier: str) -> list[str]:
        """Calls waiting for approval because they repeat `earlier` (S5.4)."""
        with self.engine.connect() as conn:
            return held_back_by(conn, earlier)

    def _calls_by_key(self, conn: Connection, keys: Sequence[str]) -> dict[str, ToolCallRecord]:
        found: dict[str, ToolCallRecord] = {}
        if not keys:
            return found
        for start in range(0, len(keys), IN_CHUNK):
            chunk = keys[start : start + IN_CHUNK]
            query = select(tool_calls).where(tool_calls.c.key.in_(chunk))
            found.update((r["key"], call_record(r)) for r in conn.execute(query).mappings())
        return found

    # --- outcomes ------------------------------------------------------------------------------

    def record_outcome(
        self,
        key: str,
        outcome: Outcome,
        *,
        from_statuses: Iterable[CallStatus] = (CallStatus.PENDING,),
        decision: ApprovalDecision | None = None,
        deadline_after: float | None = None,
        effects: Iterable[EffectClass] | None = None,
    ) -> bool:
        """End a call and append its TOOL message, once. False if it had already ended.

        `deadline_after` (a person's rejection) also requires the approval deadline to be later
        than that time, so a rejection and the deadline's expiry cannot both claim the call.
        `effects` also requires the call's recorded effect class to be one of them.
        """
        now = self.clock()
        values = _outcome_values(outcome, decision, now)
        query = (
            update(tool_calls)
            .where(tool_calls.c.key == key)
            .where(tool_calls.c.status.in_([s.value for s in from_statuses]))
        )
        if deadline_after is not None:
            query = query.where(tool_calls.c.approval_deadline > deadline_after)
        if outcome.did_not_run:
            query = query.where(tool_calls.c.claim_fence.is_(None))
        if effects is not None:
            query = query.where(tool_calls.c.effect.in_([e.value for e in effects]))
        with self.engine.begin() as conn:
            row = conn.execute(
                query.values(**values).returning(
                    tool_calls.c.tool_name,
                    tool_calls.c.arguments,
                    tool_calls.c.effect,
                    tool_calls.c.attempts,
                    tool_calls.c.claimed_attempt,
                    tool_calls.c.claimed_at,
                    tool_calls.c.claimed_by,
                    tool_calls.c.approval_edit,
                    tool_calls.c.budgets,
                )
            ).first()
            if row is None:
                return False
            call = CallKey.parse(key)
            message = tool_message_row(
                call, row.tool_name, row.arguments, outcome, now, row.approval_edit
            )
            conn.execute(insert(messages).values(**message))
            ended = (row.tool_name, row.effect, outcome.status.value, int(row.attempts or 0))
            count_ended(conn, hot_statements(self.engine), [ended])
            entries: list[Entry] = []
            if decision is not None:
                entries.append(call_entries.decided(key, decision, None))
            claim = row._mapping
            entries += call_entries.ended(call, outcome, values["finished_at"], claim)
            entries += call_entries.budget_settled(
                call, row.budgets, outcome.status.value, values["finished_at"]
            )
            appended = self.audit.append(conn, *entries)
        appended.committed()
        return True

    def record_outcomes(self, rows: Sequence[OutcomeRow]) -> None:
        """End many calls in one transaction: the batched write of the worker's hot path.

        Each call's status moves only from `pending` (a conditional UPDATE, one for the whole
        batch), and its TOOL message is inserted only where that update happened, so a row that
        lost a race to another writer changes nothing. What the UPDATE returns for each call it
        ended drives its count, its audit entries and its budgets' settlement. One commit for
        the whole batch.
        """
        for row in rows:
            if row.outcome.did_not_run:  # rare; conditional on the write fence, one by one
                self.record_outcome(row.key.key, row.outcome)
        rows = [row for row in rows if not row.outcome.did_not_run]
        if not rows:
            return
        now = self.clock()
        hot = hot_statements(self.engine)
        with driver_cursor(self.engine) as conn:  # the recorder's path: `store/hot.py`
            # Each row guarded as alone: it moves its call only from `pending` (one statement
            # for the batch on PostgreSQL, `HotStatements.end_calls`). A key given twice is
            # tried once, first come: a second UPDATE would find the call ended by the first.
            first: dict[str, OutcomeRow] = {}
            for r in rows:
                first.setdefault(r.key.key, r)
            returned = hot.end_calls(
                conn,
                [
                    {
                        "b_key": key,
                        "b_from": CallStatus.PENDING.value,
                        "b_status": r.outcome.status.value,
                        "b_error": r.outcome.error or None,
                        "b_result": r.outcome.result,
                        "b_finished_at": r.outcome.decided_at or now,
                        "b_attempts": r.outcome.attempts,
                        "b_attempt_log": r.outcome.attempt_log,
                    }
                    for key, r in first.items()
                ],
            )
            ended_here = {str(got[0]): got for got in returned}
            mine: list[dict[str, Any]] = []
            ended: list[Ended] = []
            entries: list[Entry] = []
            for r in rows:  # in the batch's order, as the audit chain was always written
                got = ended_here.pop(r.key.key, None)
                if got is None:
                    continue
                mine.append(
                    tool_message_row(r.key, r.tool_name, r.arguments, r.outcome, now, r.edit)
                )
                ended.append((r.tool_name, got[1], r.outcome.status.value, r.outcome.attempts))
                claim = {"claimed_attempt": got[2], "claimed_at": got[3], "claimed_by": got[4]}
                finished = r.outcome.decided_at or now
                entries += call_entries.ended(r.key, r.outcome, finished, claim)
                if got[5] is not None:  # its write budgets' charges (S13.1.3)
                    status = r.outcome.status.value
                    entries += call_entries.budget_settled(r.key, got[5], status, finished)
            if mine:
                hot.insert_messages.execute(conn, mine)
            count_ended(conn, hot, ended)
            appended = self.audit.append(conn, *entries)  # the batch carries its entries
        appended.committed()

    def claim_write(self, key: str, attempt: int, *, fence: str, owner: str, now: float) -> bool:
        """The write fence: commit this attempt's claim before any tool code runs.

        One conditional update: only while the call is pending and no other attempt holds the
        claim (the same fence again succeeds, for a retried command). Redis's claim says the
        attempt reached a worker; this row says whether a write may run, and it survives Redis
        going back in time (docs/ledger.md, "The write fence").

        A connection lost during the COMMIT raises `CommitUnconfirmed` (the claim may exist);
        any other exception means the claim was not made (`store/commit.py`).
        """
        values = {
            "b_key": key,
            "b_from": CallStatus.PENDING.value,
            "b_fence": fence,
            "b_attempt": attempt,
            "b_now": now,
            "b_owner": owner,
        }
        with transaction(self.engine) as conn:
            return hot_statements(self.engine).claim_write.execute(conn, values) == 1

    def record_late_result(self, key: str, late: str) -> None:
        """Evidence from a fenced attempt (S5.2); never touches status, error or result."""
        with self.engine.begin() as conn:
            conn.execute(update(tool_calls).where(tool_calls.c.key == key).values(late_result=late))
            appended = self.audit.append(conn, call_entries.late_result(key, late))
        appended.committed()

    def decide(
        self, key: str, decision: ApprovalDecision, *, now: float, epoch: str | None = None
    ) -> bool:
        """Approve: awaiting_approval -> pending, only before the deadline. One winner.

        `epoch` is the ledger life the approved call is about to be opened in; recording it lets
        the orphan check tell "approved, never opened" from "Redis lost it" even when the ledger
        changed while the call waited.
        """
        values = approval_values(decision, epoch)
        with self.engine.begin() as conn:
            result = conn.execute(
                update(tool_calls)
                .where(tool_calls.c.key == key)
                .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
                .where(tool_calls.c.approval_deadline > now)
                .values(**values)
            )
            if result.rowcount != 1:
                return False
            status = CallStatus.PENDING.value
            appended = self.audit.append(conn, call_entries.decided(key, decision, status))
        appended.committed()
        return True

    def pending_approvals(
        self, now: float, *, session_id: str | None = None, limit: int = 100
    ) -> list[ToolCallRecord]:
        """Calls waiting for a decision whose deadline has not passed, oldest request first."""
        query = (
            select(tool_calls)
            .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
            .where(tool_calls.c.approval_deadline > now)
            .order_by(tool_calls.c.requested_at, tool_calls.c.key)
            .limit(limit)
        )
        if session_id is not None:
            query = query.where(tool_calls.c.session_id == session_id)
        with self.engine.connect() as conn:
            return [call_record(r) for r in conn.execute(query).mappings()]

    # --- reads ---------------------------------------------------------------------------------

    def get_call(self, key: str) -> ToolCallRecord | None:
        hot = request_statements(self.engine)
        if hot is not None:  # driver SQL compiled once (`store/hot_request.py`), on the cursor
            with driver_cursor(self.engine) as cursor:
                found = hot.get_call.first_mapping(cursor, {"b_key": key})
            return call_record(found) if found is not None else None
        with self.engine.connect() as conn:
            query = select(tool_calls).where(tool_calls.c.key == key)
            row = conn.execute(query).mappings().first()
        return call_record(row) if row is not None else None

    def trace_context(self, key: str) -> str | None:
        """The request's trace context kept with the call (`engine/tracing.py`)."""
        query = select(tool_calls.c.trace_context).where(tool_calls.c.key == key)
        with self.engine.connect() as conn:
            value = conn.execute(query).scalar()
        return str(value) if value is not None else None

    def list_calls(
        self,
        *,
        status: CallStatus | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[ToolCallRecord]:
        query = (
            select(tool_calls).order_by(tool_calls.c.requested_at, tool_calls.c.key).limit(limit)
        )
        if status is not None:
            query = query.where(tool_calls.c.status == status.value)
        if session_id is not None:
            query = query.where(tool_calls.c.session_id == session_id)
        with self.engine.connect() as conn:
            return [call_record(r) for r in conn.execute(query).mappings()]

    def recent_calls(
        self,
        *,
        status: CallStatus | None = None,
        session_id: str | None = None,
        since: float | None = None,
        before: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> list[ToolCallRecord]:
        """Newest first; `before` is the (requested_at, key) of the last row of the previous
        page, so pages neither skip nor repeat calls while new ones arrive.

        Raises `InvalidId` for a session id that is none, `InvalidRequest` for a limit no SQL
        integer holds (nothing a driver would refuse reaches it)."""
        if session_id is not None:
            validate_id("session id", session_id)
        check_list_limit(limit)
        query = (
            select(tool_calls)
            .order_by(tool_calls.c.requested_at.desc(), tool_calls.c.key.desc())
            .limit(limit)
        )
        if status is not None:
            query = query.where(tool_calls.c.status == status.value)
        if session_id is not None:
            query = query.where(tool_calls.c.session_id == session_id)
        if since is not None:
            query = query.where(tool_calls.c.requested_at >= since)
        if before is not None:
            at, key = before
            query = query.where(
                or_(
                    tool_calls.c.requested_at < at,
                    and_(tool_calls.c.requested_at == at, tool_calls.c.key < key),
                )
            )
        with self.engine.connect() as conn:
            return [call_record(r) for r in conn.execute(query).mappings()]

    def in_flight_before(
        self, before: float, *, limit: int, after: tuple[float, str] | None = None
    ) -> list[ToolCallRecord]:
        """Calls recorded as pending since before `before`: the orphan check's candidates.

        Ordered by (requested_at, key); `after` continues from the last row of a previous page,
        so a sweeper pages through a long backlog instead of rereading its oldest rows.
        """
        query = (
            select(tool_calls)
            .where(tool_calls.c.status == CallStatus.PENDING.value)
            .where(tool_calls.c.requested_at < before)
            .order_by(tool_calls.c.requested_at, tool_calls.c.key)
            .limit(limit)
        )
        if after is not None:
            at, key = after
            query = query.where(
                or_(
                    tool_calls.c.requested_at > at,
                    and_(tool_calls.c.requested_at == at, tool_calls.c.key > key),
                )
            )
        with self.engine.connect() as conn:
            return [call_record(r) for r in conn.execute(query).mappings()]

    def finished_since(self, since: float, *, limit: int) -> list[ToolCallRecord]:
        """Calls that ended after `since`, oldest first: the finished events a rollback of the
        ledger may have taken with it (rare; a scan of recent history)."""
        query = (
            select(tool_calls)
            .where(tool_calls.c.finished_at > since)
            .order_by(tool_calls.c.finished_at, tool_calls.c.key)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [call_record(r) for r in conn.execute(query).mappings()]

    def approvals_due(self, now: float, *, limit: int) -> list[ToolCallRecord]:
        query = (
            select(tool_calls)
            .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
            .where(tool_calls.c.approval_deadline <= now)
            .order_by(tool_calls.c.approval_deadline)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [call_record(r) for r in conn.execute(query).mappings()]


def _keep_digests(rows: list[dict[str, Any]], new_calls: Sequence[NewCall]) -> None:
    """A batch with a call that waits for a person keeps, for each such call, the digests its
    approval will be bound to (S13.3); every row gets the columns, so the batch stays one
    statement. Calls that run at once keep none (nothing to bind), except a call that draws on a
    write budget: its open may find the budget used up and make it wait (S13.1.4)."""
    by_key = {new.key.key: new for new in new_calls}
    for row in rows:
        waits = row["status"] == CallStatus.AWAITING_APPROVAL.value or bool(row.get("budgets"))
        new = by_key[row["key"]]
        row["arguments_digest"] = new.repeat_digest if waits else None
        row["definition_digest"] = new.definition_digest if waits else None


def _outcome_values(
    outcome: Outcome, decision: ApprovalDecision | None, now: float
) -> dict[str, Any]:
    """The columns a single outcome write sets (with a person's decision, if any)."""
    values: dict[str, Any] = dict(
        status=outcome.status.value,
        error=outcome.error or None,
        result=outcome.result,
        finished_at=outcome.decided_at or now,
    )
    if outcome.attempts:
        values["attempts"] = outcome.attempts
    if outcome.attempt_log is not None:
        values["attempt_log"] = outcome.attempt_log
    if decision is not None:
        values.update(
            decision=decision.decision,
            decided_by=decision.decided_by,
            decided_at=decision.decided_at,
            decision_note=decision.note,
        )
    return values
