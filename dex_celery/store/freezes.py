"""The write freeze in SQL (S13.2): its history, the freezes in force, the calls it held.

`dex_write_freezes` is the durable record: the ledger's copy (`ledger/freeze.py`) is only what
the claim reads, and is re-asserted from here. Every change is one transaction; a hold and a
release are conditional updates of the call's status, so a person's decision, the approval
deadline and a thaw cannot all win the same call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from sqlalchemy import Engine, RowMapping, delete, insert, select, update

from dex_celery.audit import call_entries
from dex_celery.audit.chain import NOTHING, Appended, AuditLog
from dex_celery.audit.entries import AuditKind, Entry
from dex_celery.model.freeze import ALL_TOOLS, FreezeMode, WriteFreeze
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.store.rows import call_record
from dex_celery.store.schema import freeze_holds, tool_calls, write_freezes

#: Most held calls one thaw releases in one pass (a thaw loops until none is left).
RELEASE_BATCH = 500


def _freeze(row: RowMapping) -> WriteFreeze:
    return WriteFreeze(
        id=int(row["id"]),
        tool=row["tool"],
        mode=FreezeMode(row["mode"]),
        reason=row["reason"],
        frozen_by=row["frozen_by"],
        since=float(row["frozen_at"]),
        thawed_by=row["thawed_by"],
        thawed_at=row["thawed_at"],
    )


class Hold(Enum):
    """What a freeze's hold of a call came to."""

    HELD = "held"
    #: The call had moved on (ended, decided, or claimed by an attempt of another ledger life).
    MOVED_ON = "moved_on"
    #: The freeze had ended before the hold (thawed, or replaced by one of the same scope): the
    #: call stays `pending`, for its worker to open again.
    THAWED = "thawed"


@dataclass(frozen=True, slots=True)
class FreezeHold:
    """A call a freeze held: when, by which freeze, and when a thaw released it (None: not)."""

    call_key: str
    freeze: WriteFreeze
    held_at: float
    released_at: float | None


@dataclass(frozen=True, slots=True)
class HeldCall:
    """A call a thaw released: its record (now `pending`) and whether it may have run."""

    record: ToolCallRecord
    may_have_run: bool


class WriteFreezes:
    """Repository over `dex_write_freezes` and `dex_freeze_holds`, on the `Store`'s engine
    (`engine`: `lambda: store.engine`, or the ledger guard's, which has no `Store`)."""

    def __init__(self, engine: Callable[[], Engine], audit: AuditLog | None = None) -> None:
        self._engine = engine
        #: The audit log freezes, thaws, holds and releases are appended to (docs/audit.md).
        self._audit = audit

    def _append(self, conn: Any, *entries: Entry) -> Appended:
        return self._audit.append(conn, *entries) if self._audit is not None else NOTHING

    # --- freezes ---------------------------------------------------------------------------------

    def begin(
        self, tools: Sequence[str], mode: FreezeMode, reason: str, by: str, now: float
    ) -> list[WriteFreeze]:
        """Freeze `tools` (or `ALL_TOOLS`); a freeze of the same scope in force is replaced
        (thawed by the same operator at the same time), so one row per scope is in force."""
        active = write_freezes.c.thawed_at.is_(None)
        made: list[WriteFreeze] = []
        with self._engine().begin() as conn:
            conn.execute(
                update(write_freezes)
                .where(active)
                .where(write_freezes.c.tool.in_(list(tools)))
                .values(thawed_by=by, thawed_at=now)
            )
            for tool in tools:
                new_id = conn.execute(
                    insert(write_freezes)
                    .values(tool=tool, mode=mode.value, reason=reason, frozen_by=by, frozen_at=now)
                    .returning(write_freezes.c.id)
                ).scalar_one()
                made.append(WriteFreeze(int(new_id), tool, mode, reason, by, now))
            kind = AuditKind.FREEZE
            done = [call_entries.freeze(kind, t, by, reason, mode.value) for t in tools]
            appended = self._append(conn, *done)
        appended.committed()
        return made

    def end(self, tools: Sequence[str] | None, by: str, now: float) -> list[WriteFreeze]:
        """Thaw the freezes in force of `tools` (None: every one); returns those thawed."""
        query = update(write_freezes).where(write_freezes.c.thawed_at.is_(None))
        if tools is not None:
            query = query.where(write_freezes.c.tool.in_(list(tools)))
        with self._engine().begin() as conn:
            rows = conn.execute(
                query.values(thawed_by=by, thawed_at=now).returning(*write_freezes.c)
            ).mappings()
            thawed = sorted((_freeze(r) for r in rows), key=lambda f: f.id)
            kind = AuditKind.THAW
            done = [call_entries.freeze(kind, f.tool, by, None, None) for f in thawed]
            appended = self._append(conn, *done)
        appended.committed()
        return thawed

    def active(self) -> list[WriteFreeze]:
        """The freezes in force, oldest first."""
        query = (
            select(write_freezes)
            .where(write_freezes.c.thawed_at.is_(None))
            .order_by(write_freezes.c.id)
        )
        with self._engine().connect() as conn:
            return [_freeze(r) for r in conn.execute(query).mappings()]

    def history(self, *, limit: int = 20) -> list[WriteFreeze]:
        """The newest freezes, in force or thawed, newest first."""
        query = select(write_freezes).order_by(write_freezes.c.id.desc()).limit(limit)
        with self._engine().connect() as conn:
            return [_freeze(r) for r in conn.execute(query).mappings()]

    # --- held calls ------------------------------------------------------------------------------

    def hold(
        self, key: str, freeze: WriteFreeze, *, deadline: float, may_have_run: bool, now: float
    ) -> Hold:
        """A pending write whose claim the freeze refused waits for a person: one conditional
        update (`pending`, never claimed in SQL) and the hold's row, in one transaction.

        The hold commits only while `freeze` is in force, read under a lock a thaw's `end`
        must wait for (PostgreSQL: the freeze's row, shared; SQLite: the write lock the update
        took): so a thaw either ends the freeze first, and no hold of it is made (`THAWED`), or
        comes after the hold and its `release` sees it. Nothing else releases held calls, and
        a thaw's report names every call it freed."""
        with self._engine().begin() as conn:
            moved = conn.execute(
                update(tool_calls)
                .where(tool_calls.c.key == key)
                .where(tool_calls.c.status == CallStatus.PENDING.value)
                .where(tool_calls.c.claim_fence.is_(None))
                .values(status=CallStatus.AWAITING_APPROVAL.value, approval_deadline=deadline)
            ).rowcount
            if moved != 1:
                return Hold.MOVED_ON
            if not self._in_force(conn, freeze):
                conn.rollback()
                return Hold.THAWED
            conn.execute(delete(freeze_holds).where(freeze_holds.c.call_key == key))
            conn.execute(
                insert(freeze_holds).values(
                    call_key=key,
                    freeze_id=freeze.id,
                    held_at=now,
                    may_have_run=1 if may_have_run else 0,
                )
            )
            waits = CallStatus.AWAITING_APPROVAL.value
            appended = self._append(conn, call_entries.asked_again(key, waits, "frozen", deadline))
        appended.committed()
        return Hold.HELD

    @staticmethod
    def _in_force(conn: Any, freeze: WriteFreeze) -> bool:
        query = (
            select(write_freezes.c.id)
            .where(write_freezes.c.id == freeze.id)
            .where(write_freezes.c.thawed_at.is_(None))
            .with_for_update(read=True)
        )
        return conn.execute(query).first() is not None

    def holders(self, keys: Sequence[str]) -> dict[str, WriteFreeze]:
        """The freeze that holds each of `keys` (calls held and not released)."""
        if not keys:
            return {}
        query = (
            select(freeze_holds.c.call_key, *write_freezes.c)
            .select_from(
                freeze_holds.join(write_freezes, write_freezes.c.id == freeze_holds.c.freeze_id)
            )
            .where(freeze_holds.c.call_key.in_(list(keys)))
            .where(freeze_holds.c.released_at.is_(None))
        )
        with self._engine().connect() as conn:
            return {r["call_key"]: _freeze(r) for r in conn.execute(query).mappings()}

    def holds_of(self, keys: Sequence[str]) -> list[FreezeHold]:
        """The holds of `keys` (the session timeline's source), released or not."""
        if not keys:
            return []
        query = (
            select(freeze_holds, *write_freezes.c)
            .select_from(
                freeze_holds.join(write_freezes, write_freezes.c.id == freeze_holds.c.freeze_id)
            )
            .where(freeze_holds.c.call_key.in_(list(keys)))
        )
        with self._engine().connect() as conn:
            return [
                FreezeHold(r["call_key"], _freeze(r), r["held_at"], r["released_at"])
                for r in conn.execute(query).mappings()
            ]

    def may_have_run(self, key: str) -> bool:
        """Whether an attempt of a held call had reached a worker before its hold."""
        query = select(freeze_holds.c.may_have_run).where(freeze_holds.c.call_key == key)
        with self._engine().connect() as conn:
            return bool(conn.execute(query).scalar())

    def release(
        self, still_frozen: Sequence[str], now: float, start: Callable[[HeldCall], None]
    ) -> list[HeldCall]:
        """Let the held calls run again, oldest request first: each still waiting (and within
        its deadline) moves to `pending`, one conditional update each, so a person deciding the
        same call at the same moment wins or loses cleanly; `start` opens it at once, before the
        next is released, so no other opener (the sweeper's orphan check) finds a released call
        unopened for longer than its own step and the calls are published in request order.
        Calls of a tool in `still_frozen` (`ALL_TOOLS`: every tool) stay held."""
        if ALL_TOOLS in still_frozen:
            return []
        released: list[HeldCall] = []
        query = (
            select(tool_calls, freeze_holds.c.may_have_run)
            .select_from(freeze_holds.join(tool_calls, tool_calls.c.key == freeze_holds.c.call_key))
            .where(freeze_holds.c.released_at.is_(None))
            .order_by(tool_calls.c.requested_at, tool_calls.c.key)
            .limit(RELEASE_BATCH)
        )
        if still_frozen:
            query = query.where(tool_calls.c.tool_name.not_in(list(still_frozen)))
        while True:
            with self._engine().connect() as conn:
                rows = list(conn.execute(query).mappings())
            for row in rows:
                with self._engine().begin() as conn:
                    conn.execute(
                        update(freeze_holds)
                        .where(freeze_holds.c.call_key == row["key"])
                        .values(released_at=now)
                    )
                    resumed = self._resume(conn, row["key"], now)
                    appended = NOTHING
                    if resumed:
                        appended = self._append(conn, call_entries.released(row["key"]))
                appended.committed()
                if resumed:
                    held = HeldCall(
                        call_record({**row, "status": CallStatus.PENDING.value}),
                        bool(row["may_have_run"]),
                    )
                    start(held)
                    released.append(held)
            if len(rows) < RELEASE_BATCH:
                return released

    @staticmethod
    def _resume(conn: Any, key: str, now: float) -> bool:
        return bool(
            conn.execute(
                update(tool_calls)
                .where(tool_calls.c.key == key)
                .where(tool_calls.c.status == CallStatus.AWAITING_APPROVAL.value)
                .where(tool_calls.c.approval_deadline > now)
                .values(status=CallStatus.PENDING.value)
            ).rowcount
            == 1
        )
