"""The system of record: sessions, messages and tool-call records in SQL.

Every write that ends a call is a conditional update (`WHERE status IN (...)`) in the same
transaction as its TOOL message, so an outcome lands once however many writers (worker, sweeper,
approver) race to record it, and a refused write leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    insert,
    or_,
    select,
    update,
)

from dex_celery.errors import UnknownSession
from dex_celery.ids import CallKey
from dex_celery.outcomes import CallStatus
from dex_celery.policy import EffectClass
from dex_celery.records import (
    ApprovalDecision,
    Message,
    MessageRole,
    SessionRecord,
    ToolCallRecord,
)
from dex_celery.store.dialect import IN_CHUNK, insert_ignore, insert_many_ignore
from dex_celery.store.engine import EngineHandle
from dex_celery.store.rows import (
    call_record,
    message_record,
    session_record,
    tool_message_row,
)
from dex_celery.store.schema import messages, metadata, sessions, tool_calls
from dex_celery.store.values import NewCall, Outcome, OutcomeRow


class Store:
    """Repository over one database. Safe to share between threads; re-made after a fork."""

    def __init__(
        self, url: str, *, clock: Callable[[], float] = time.time, schema: str | None = None
    ) -> None:
        self.url = url
        self.clock = clock
        #: PostgreSQL schema of the tables (`Settings.database_schema`); None: the default one.
        self.schema = schema
        self._engine = EngineHandle(url, schema=schema)

    @property
    def engine(self) -> Engine:
        return self._engine.get()

    def create_schema(self) -> None:
        """For tests and the embedded demo; production runs `dex-celery db upgrade` (Alembic)."""
        metadata.create_all(self.engine)

    # --- sessions ------------------------------------------------------------------------------

    def open_session(
        self, session_id: str, default_effect: EffectClass | None = None
    ) -> SessionRecord:
        with self.engine.begin() as conn:
            insert_ignore(
                conn,
                sessions,
                id=session_id,
                default_effect=default_effect.value if default_effect else None,
                created_at=self.clock(),
            )
            row = conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().one()
        return session_record(row)

    def get_session(self, session_id: str) -> SessionRecord:
        with self.engine.connect() as conn:
            row = (
                conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().first()
            )
        if row is None:
            raise UnknownSession(f"no session {session_id!r}")
        return session_record(row)

    # --- requests ------------------------------------------------------------------------------

    def insert_calls(
        self,
        new_calls: Sequence[NewCall],
        *,
        epoch: str,
        check: Callable[[NewCall, ToolCallRecord], None] | None = None,
    ) -> list[tuple[ToolCallRecord, bool]]:
        """Record new calls in one transaction; a key already recorded returns its record (S2.3).

        Returns (record, created) per request, in order. `check(new, recorded)` is called for
        each request whose key is recorded already; what it raises rolls the whole batch back.
        """
        now = self.clock()
        keys = [new.key.key for new in new_calls]
        with self.engine.begin() as conn:
            known = self._calls_by_key(conn, keys)
            defaults: dict[str, EffectClass | None] = {}
            rows: list[dict[str, Any]] = []
            batched: set[str] = set()
            for new in new_calls:
                if new.key.key in known or new.key.key in batched:
                    continue
                batched.add(new.key.key)
                sid = new.key.session_id
                if sid not in defaults:
                    defaults[sid] = self._session_default(conn, sid, now)
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
                    )
                )
            created = insert_many_ignore(conn, tool_calls, rows)
            lost = [r["key"] for r in rows if r["key"] not in created]
            if lost:  # concurrent requests of the same calls won (S2.3)
                known.update(self._calls_by_key(conn, lost))
            if check is not None:
                for new in new_calls:
                    if new.key.key in known:
                        check(new, known[new.key.key])
        fresh = {r["key"]: call_record(r) for r in rows if r["key"] in created}
        out: list[tuple[ToolCallRecord, bool]] = []
        for key in keys:
            # The first mention creates the call; a repeat in the same batch is the same call.
            out.append((fresh[key], True) if key in fresh else (known[key], False))
            fresh.pop(key, None)
            known.setdefault(key, out[-1][0])
        return out

    def _calls_by_key(self, conn: Connection, keys: Sequence[str]) -> dict[str, ToolCallRecord]:
        found: dict[str, ToolCallRecord] = {}
        for start in range(0, len(keys), IN_CHUNK):
            chunk = keys[start : start + IN_CHUNK]
            query = select(tool_calls).where(tool_calls.c.key.in_(chunk))
            found.update((r["key"], call_record(r)) for r in conn.execute(query).mappings())
        return found

    def _session_default(self, conn: Connection, session_id: str, now: float) -> EffectClass | None:
        default = conn.execute(
            select(sessions.c.default_effect).where(sessions.c.id == session_id)
        ).first()
        if default is None:
            # Insert-or-ignore: two first requests of a new session may race here (S2.3).
            if insert_ignore(conn, sessions, id=session_id, default_effect=None, created_at=now):
                return None
            default = conn.execute(
                select(sessions.c.default_effect).where(sessions.c.id == session_id)
            ).first()
            if default is None:
                return None
        return EffectClass.parse(default[0]) if default[0] else None

    # --- outcomes ------------------------------------------------------------------------------

    def record_outcome(
        self,
        key: str,
        outcome: Outcome,
        *,
        from_statuses: Iterable[CallStatus] = (CallStatus.PENDING,),
        decision: ApprovalDecision | None = None,
        deadline_after: float | None = None,
    ) -> bool:
        """End a call and append its TOOL message, once. False if it had already ended.

        `deadline_after` (a person's rejection) also requires the approval deadline to be later
        than that time, so a rejection and the deadline's expiry cannot both claim the call.
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
        with self.engine.begin() as conn:
            row = conn.execute(
                query.values(**values).returning(tool_calls.c.tool_name, tool_calls.c.arguments)
            ).first()
            if row is None:
                return False
            message = tool_message_row(
                CallKey.parse(key), row.tool_name, row.arguments, outcome, now
            )
            conn.execute(insert(messages).values(**message))
        return True

    def record_outcomes(self, rows: Sequence[OutcomeRow]) -> None:
        """End many calls in one transaction: the batched write of the worker's hot path.

        Each call's status moves only from `pending` (a conditional UPDATE), and its TOOL
        message is inserted only where that update happened, so a row that lost a race to
        another writer changes nothing. One commit for the whole batch.
        """
        for row in rows:
            if row.outcome.did_not_run:  # rare; conditional on the write fence, one by one
                self.record_outcome(row.key.key, row.outcome)
        rows = [row for row in rows if not row.outcome.did_not_run]
        if not rows:
            return
        now = self.clock()
        update_stmt = (
            update(tool_calls)
            .where(tool_calls.c.key == bindparam("b_key"))
            .where(tool_calls.c.status == CallStatus.PENDING.value)
            .values(
                status=bindparam("b_status"),
                error=bindparam("b_error"),
                result=bindparam("b_result"),
                finished_at=bindparam("b_finished_at"),
                attempts=bindparam("b_attempts"),
                attempt_log=bindparam("b_attempt_log"),
            )
            .returning(tool_calls.c.key)
        )
        updates = [
            {
                "b_key": r.key.key,
                "b_status": r.outcome.status.value,
                "b_error": r.outcome.error or None,
                "b_result": r.outcome.result,
                "b_finished_at": now,
                "b_attempts": r.outcome.attempts,
                "b_attempt_log": r.outcome.attempt_log,
            }
            for r in rows
        ]
        new_messages = [
            tool_message_row(r.key, r.tool_name, r.arguments, r.outcome, now) for r in rows
        ]
        with self.engine.begin() as conn:
            ended = {key for u in updates for key in conn.execute(update_stmt, u).scalars()}
            mine = [m for m in new_messages if m["call_key"] in ended]
            if mine:
                conn.execute(insert(messages), mine)

    def claim_write(self, key: str, attempt: int, *, fence: str, owner: str, now: float) -> bool:
        """The write fence: commit this attempt's claim before any tool code runs.

        One conditional update: only while the call is pending and no other attempt holds the
        claim (the same fence again succeeds, for a retried command). Redis's claim says the
        attempt reached a worker; this row says whether a write may run, and it survives Redis
        going back in time (docs/ledger.md, "The write fence").
        """
        with self.engine.begin() as conn:
            result = conn.execute(
                update(tool_calls)
                .where(tool_calls.c.key == key)
                .where(tool_calls.c.status == CallStatus.PENDING.value)
                .where(or_(tool_calls.c.claim_fence.is_(None), tool_calls.c.claim_fence == fence))
                .values(
                    claim_fence=fence, claimed_attempt=attempt, claimed_at=now, claimed_by=owner
                )
            )
            return bool(result.rowcount == 1)

    def record_late_result(self, key: str, late: str) -> None:
        """Evidence from a fenced attempt (S5.2); never touches status, error or result."""
        with self.engine.begin() as conn:
            conn.execute(update(tool_calls).where(tool_calls.c.key == key).values(late_result=late))

    def decide(
        self, key: str, decision: ApprovalDecision, *, now: float, epoch: str | None = None
    ) -> bool:
        """Approve: awaiting_approval -> pending, only before the deadline. One winner.

        `epoch` is the ledger life the approved call is about to be opened in; recording it lets
        the orphan check tell "approved, never opened" from "Redis lost it" even when the ledger
        changed while the call waited.
        """
        values: dict[str, Any] = dict(
            status=CallStatus.PENDING.value,
            decision=decision.decision,
            decided_by=decision.decided_by,
            decided_at=decision.decided_at,
            decision_note=decision.note,
        )
        if epoch is not None:
            values["ledger_epoch"] = epoch
        with self.engine.begin() as conn:
            result = conn.execute(
                update(tool_calls)
                .where(tool_calls.c.key == key)
                .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
                .where(tool_calls.c.approval_deadline > now)
                .values(**values)
            )
            return bool(result.rowcount == 1)

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
        with self.engine.connect() as conn:
            row = conn.execute(select(tool_calls).where(tool_calls.c.key == key)).mappings().first()
        return call_record(row) if row is not None else None

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
        page, so pages neither skip nor repeat calls while new ones arrive."""
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

    def snapshot(self, session_id: str) -> tuple[list[ToolCallRecord], list[Message]]:
        with self.engine.connect() as conn:
            if (
                conn.execute(select(sessions.c.id).where(sessions.c.id == session_id)).first()
                is None
            ):
                raise UnknownSession(f"no session {session_id!r}")
            calls = [
                call_record(r)
                for r in conn.execute(
                    select(tool_calls)
                    .where(tool_calls.c.session_id == session_id)
                    .order_by(tool_calls.c.requested_at, tool_calls.c.key)
                ).mappings()
            ]
            history = [
                message_record(r)
                for r in conn.execute(
                    select(messages)
                    .where(messages.c.session_id == session_id)
                    .order_by(messages.c.id)
                ).mappings()
            ]
        return calls, history

    def append_message(self, session_id: str, role: MessageRole, text: str) -> Message:
        now = self.clock()
        with self.engine.begin() as conn:
            if (
                conn.execute(select(sessions.c.id).where(sessions.c.id == session_id)).first()
                is None
            ):
                raise UnknownSession(f"no session {session_id!r}")
            result = conn.execute(
                insert(messages).values(
                    session_id=session_id, role=role.value, text=text, created_at=now
                )
            )
            new_id = result.inserted_primary_key[0] if result.inserted_primary_key else 0
        return Message(role=role, text=text, id=int(new_id), created_at=now)


def _outcome_values(
    outcome: Outcome, decision: ApprovalDecision | None, now: float
) -> dict[str, Any]:
    """The columns a single outcome write sets (with a person's decision, if any)."""
    values: dict[str, Any] = dict(
        status=outcome.status.value,
        error=outcome.error or None,
        result=outcome.result,
        finished_at=now,
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
