"""The repeat guard's persistence (S5.4): who holds each (session, digest) slot, and who waits.

`dex_repeat_guards` has one row per session and digest of tool + canonical arguments naming the
last call that passed the guard (the holder). A guarded request, in its insert's transaction:

1. tries to insert the slot with itself as holder (`INSERT ... ON CONFLICT DO NOTHING`): a new
   digest passes with that one statement;
2. otherwise reads the holder's record (a primary-key lookup joined to the call and its unknown
   outcome row) and has the dispatcher judge it (`model/repeat_rule.judge_repeat`);
3. if the holder is harmless, takes the slot with a compare-and-set on `holder`; if another
   request took it first, reads it again and judges the winner.

Two identical requests racing in two processes therefore meet on one row: on PostgreSQL the
second insert waits for the first transaction and then sees its call; on SQLite writers are
serialised. Exactly one of them passes; the other is judged against it (in flight) and waits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, select, update

from dex_celery.model.records import ToolCallRecord
from dex_celery.model.repeat_rule import RepeatHazard, RepeatKind
from dex_celery.store.dialect import insert_ignore
from dex_celery.store.rows import call_record
from dex_celery.store.schema import repeat_guards, tool_calls, unknown_outcomes
from dex_celery.store.values import Admission

#: `dex_unknown_outcomes.state` of a call whose real outcome was reported (`store/unknowns.py`).
REPORTED = "reported"

#: Judges the holder of a slot: (its record, reconciled?, the new call's repeat window) -> why
#: the new call waits, or None.
Judge = Callable[[ToolCallRecord, bool, float], RepeatHazard | None]


@dataclass(frozen=True, slots=True)
class RepeatCheck:
    """What the dispatcher hands the store for guarded requests: `judge` the slot's holder,
    and `hold` a call back (its admission when it must wait; `dispatch.hold_back`)."""

    judge: Judge
    hold: Callable[[Admission, RepeatHazard, float], Admission]


#: Compare-and-set rounds before a request that keeps losing the slot gives up and waits.
_ROUNDS = 4


def pass_guard(
    conn: Connection, session_id: str, digest: str, key: str, judge: Judge, window: float = 0.0
) -> RepeatHazard | None:
    """Take the slot for `key` or say why it must wait; None means it passed (it holds the slot).

    Runs inside the caller's transaction, so the slot and the call row commit together.
    """
    slot = (repeat_guards.c.session_id == session_id) & (repeat_guards.c.digest == digest)
    holder_key = ""
    for _ in range(_ROUNDS):
        if insert_ignore(conn, repeat_guards, session_id=session_id, digest=digest, holder=key):
            return None
        row = (
            conn.execute(
                select(
                    repeat_guards.c.holder.label("guard_holder"),
                    unknown_outcomes.c.state.label("unknown_state"),
                    *tool_calls.c,
                )
                .select_from(
                    repeat_guards.outerjoin(
                        tool_calls, tool_calls.c.key == repeat_guards.c.holder
                    ).outerjoin(unknown_outcomes, unknown_outcomes.c.call_key == tool_calls.c.key)
                )
                .where(slot)
            )
            .mappings()
            .first()
        )
        if row is None:  # removed meanwhile (never done today); insert again
            continue
        holder_key = row["guard_holder"]
        if holder_key == key:
            return None
        if row["key"] is not None:
            hazard = judge(call_record(row), row["unknown_state"] == REPORTED, window)
            if hazard is not None:
                return hazard
        taken = conn.execute(
            update(repeat_guards)
            .where(slot)
            .where(repeat_guards.c.holder == holder_key)
            .values(holder=key)
        )
        if taken.rowcount == 1:
            return None
    # Lost the slot to other requests round after round: the winner is in flight.
    return RepeatHazard(holder_key, RepeatKind.IN_FLIGHT)


def take_guard(conn: Connection, session_id: str, digest: str, key: str) -> None:
    """An approved held-back call runs: it becomes the slot's holder, so the next identical
    request is judged against it (a person has weighed the earlier call's evidence)."""
    if not insert_ignore(conn, repeat_guards, session_id=session_id, digest=digest, holder=key):
        conn.execute(
            update(repeat_guards)
            .where(repeat_guards.c.session_id == session_id)
            .where(repeat_guards.c.digest == digest)
            .values(holder=key)
        )


def held_back_by(conn: Connection, earlier: str) -> list[str]:
    """Keys of calls still waiting for approval because they repeat `earlier` (partial index)."""
    query = (
        select(tool_calls.c.key)
        .where(tool_calls.c.repeat_of == earlier)
        .where(tool_calls.c.status == "awaiting_approval")
        .order_by(tool_calls.c.key)
    )
    return [str(k) for k in conn.execute(query).scalars()]
