"""What the reconcile beat job remembers about `outcome_unknown` calls (S8.2, S8.4).

One row per surfaced call in `dex_unknown_outcomes`. Surfacing is an insert that does nothing
on conflict, so two runners at once surface a call once; reporting flips `open -> reported` and
appends the user message in one transaction, so a report is sent once however many runners race.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select, update

from dex_celery.audit import call_entries
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import MessageRole, ToolCallRecord
from dex_celery.store.budgets import WENT_THROUGH
from dex_celery.store.dialect import insert_ignore
from dex_celery.store.repository import Store
from dex_celery.store.schema import messages, tool_calls, unknown_outcomes

OPEN = "open"
REPORTED = "reported"


@dataclass(frozen=True, slots=True)
class UnknownOutcome:
    """The reconcile state of one surfaced `outcome_unknown` call."""

    call_key: str
    session_id: str
    tool_name: str
    state: str
    surfaced_at: float
    checks: int
    last_checked_at: float | None
    last_error: str | None
    report: str | None
    reported_at: float | None
    #: What the check said became of the call (`went_through`, `did_not_run`), if it told.
    verdict: str | None = None


class UnknownOutcomes:
    """Repository over `dex_unknown_outcomes`, sharing the `Store`'s engine."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def unsurfaced(self, *, limit: int) -> list[str]:
        """Keys of `outcome_unknown` calls not surfaced yet, oldest end first."""
        query = (
            select(tool_calls.c.key)
            .select_from(
                tool_calls.outerjoin(
                    unknown_outcomes, unknown_outcomes.c.call_key == tool_calls.c.key
                )
            )
            .where(tool_calls.c.status == CallStatus.OUTCOME_UNKNOWN.value)
            .where(unknown_outcomes.c.call_key.is_(None))
            .order_by(tool_calls.c.finished_at, tool_calls.c.key)
            .limit(limit)
        )
        with self.store.engine.connect() as conn:
            return [str(r[0]) for r in conn.execute(query)]

    def surface(self, record: ToolCallRecord, *, now: float) -> bool:
        """Remember the call as surfaced; True only for the one runner that did it first."""
        with self.store.engine.begin() as conn:
            return insert_ignore(
                conn,
                unknown_outcomes,
                call_key=record.key,
                session_id=record.session_id,
                tool_name=record.tool_name,
                state=OPEN,
                surfaced_at=now,
                checks=0,
            )

    def open_keys(self, tool_names: Collection[str], *, limit: int) -> list[str]:
        """Keys of surfaced, unreported calls of the given tools (those with a check)."""
        if not tool_names:
            return []
        query = (
            select(unknown_outcomes.c.call_key)
            .where(unknown_outcomes.c.state == OPEN)
            .where(unknown_outcomes.c.tool_name.in_(sorted(tool_names)))
            .order_by(
                unknown_outcomes.c.last_checked_at.is_not(None), unknown_outcomes.c.surfaced_at
            )
            .limit(limit)
        )
        with self.store.engine.connect() as conn:
            return [str(r[0]) for r in conn.execute(query)]

    def count_open_without(self, tool_names: Collection[str]) -> int:
        """Open calls whose tool has no check: left for a person."""
        query = (
            select(func.count())
            .select_from(unknown_outcomes)
            .where(unknown_outcomes.c.state == OPEN)
        )
        if tool_names:
            query = query.where(unknown_outcomes.c.tool_name.not_in(sorted(tool_names)))
        with self.store.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def user_texts(self, session_id: str) -> str:
        """Every user message of the session, joined: what the seed's dedup reads (S8.2)."""
        query = (
            select(messages.c.text)
            .where(messages.c.session_id == session_id)
            .where(messages.c.role == MessageRole.USER.value)
            .order_by(messages.c.id)
        )
        with self.store.engine.connect() as conn:
            return "\n".join(r[0] or "" for r in conn.execute(query))

    def note_check(self, key: str, *, now: float, error: str | None) -> None:
        """Count one check of the call; `error` is kept for `calls show` and cleared on success."""
        with self.store.engine.begin() as conn:
            conn.execute(
                update(unknown_outcomes)
                .where(unknown_outcomes.c.call_key == key)
                .values(
                    checks=unknown_outcomes.c.checks + 1,
                    last_checked_at=now,
                    last_error=error,
                )
            )

    def report(
        self, record: ToolCallRecord, text: str, *, now: float, verdict: str | None = None
    ) -> bool:
        """Send `text` to the session as a user message and mark the call reported, atomically.

        False (and nothing sent) if another runner reported it first.
        """
        with self.store.engine.begin() as conn:
            claimed = conn.execute(
                update(unknown_outcomes)
                .where(unknown_outcomes.c.call_key == record.key)
                .where(unknown_outcomes.c.state == OPEN)
                .values(
                    state=REPORTED, report=text, reported_at=now, last_error=None, verdict=verdict
                )
            )
            if claimed.rowcount != 1:
                return False
            conn.execute(
                insert(messages).values(
                    session_id=record.session_id,
                    role=MessageRole.USER.value,
                    text=text,
                    created_at=now,
                )
            )
            entries = [call_entries.report_sent(record.key, record.session_id, text, now)]
            if verdict is not None:  # the verdict settles the held charges (S13.1.3)
                spent = verdict == WENT_THROUGH
                entries += call_entries.budget_reconciled(
                    record.key, record.budgets, verdict, spent, now
                )
            appended = self.store.audit.append(conn, *entries)
        appended.committed()
        return True

    def mark_reported(self, key: str, *, now: float) -> bool:
        """The session's history already names the call (someone reported it): close it."""
        with self.store.engine.begin() as conn:
            result = conn.execute(
                update(unknown_outcomes)
                .where(unknown_outcomes.c.call_key == key)
                .where(unknown_outcomes.c.state == OPEN)
                .values(state=REPORTED, reported_at=now)
            )
            return bool(result.rowcount == 1)

    def of_session(self, session_id: str) -> list[UnknownOutcome]:
        """The surfaced calls of one session, in the order they were surfaced (its timeline)."""
        query = (
            select(unknown_outcomes)
            .where(unknown_outcomes.c.session_id == session_id)
            .order_by(unknown_outcomes.c.surfaced_at, unknown_outcomes.c.call_key)
        )
        with self.store.engine.connect() as conn:
            return [_row(r) for r in conn.execute(query).mappings()]

    def get(self, key: str) -> UnknownOutcome | None:
        with self.store.engine.connect() as conn:
            row = (
                conn.execute(select(unknown_outcomes).where(unknown_outcomes.c.call_key == key))
                .mappings()
                .first()
            )
        return _row(row) if row is not None else None


def _row(row: Any) -> UnknownOutcome:
    return UnknownOutcome(
        call_key=row["call_key"],
        session_id=row["session_id"],
        tool_name=row["tool_name"],
        state=row["state"],
        surfaced_at=row["surfaced_at"],
        checks=row["checks"] or 0,
        last_checked_at=row["last_checked_at"],
        last_error=row["last_error"],
        report=row["report"],
        reported_at=row["reported_at"],
        verdict=row.get("verdict"),
    )
