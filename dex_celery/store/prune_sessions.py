"""The sessions a prune removes (S12.4): those no call is left in and nothing recent touched.

Kept apart from the calls (`store/retention.py`), whose batches run first: a session goes when it
began before the cutoff, no call of it is left and it has no message from the cutoff on; its
messages and owner row go with it, archived first as one record per session.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import Engine, and_, delete, exists, func, select
from sqlalchemy.sql.elements import ColumnElement

from dex_celery.store.dialect import IN_CHUNK, insert_ignore, one_of
from dex_celery.store.retention import Removed, chunks, plain
from dex_celery.store.schema import messages, repeat_guards, session_owners, sessions, tool_calls


def _idle(cutoff: float) -> ColumnElement[bool]:
    """A session with no call left and no message from the cutoff on."""
    return and_(
        ~exists().where(tool_calls.c.session_id == sessions.c.id),
        ~exists().where(
            and_(messages.c.session_id == sessions.c.id, messages.c.created_at >= cutoff)
        ),
    )


def select_sessions(
    engine: Engine, *, cutoff: float, after: str | None, limit: int
) -> tuple[list[dict[str, Any]], str | None]:
    """Archive records of the next sessions (in id order after `after`) that began before the
    cutoff and are idle since; and the last id scanned (None when the scan is done)."""
    scan = select(sessions.c.id).order_by(sessions.c.id).limit(limit)
    if after is not None:
        scan = scan.where(sessions.c.id > after)
    with engine.connect() as conn:
        ids = [str(i) for i in conn.execute(scan).scalars()]
        if not ids:
            return [], None
        query = (
            select(sessions)
            .where(one_of(conn, sessions.c.id, ids))
            .where(sessions.c.created_at < cutoff)
            .where(_idle(cutoff))
            .order_by(sessions.c.id)
        )
        rows = [plain(r) for r in conn.execute(query).mappings()]
        going = [r["id"] for r in rows]
        history: dict[str, list[dict[str, Any]]] = {}
        owners: dict[str, dict[str, Any]] = {}
        for chunk in chunks(going):
            query = (
                select(messages)
                .where(one_of(conn, messages.c.session_id, chunk))
                .order_by(messages.c.id)
            )
            for m in conn.execute(query).mappings():
                history.setdefault(m["session_id"], []).append(plain(m))
            query = select(session_owners).where(one_of(conn, session_owners.c.session_id, chunk))
            for o in conn.execute(query).mappings():
                owners[o["session_id"]] = plain(o)
    records = [
        {
            "kind": "session",
            "key": row["id"],
            "session": row,
            "owner": owners.get(row["id"]),
            "messages": history.get(row["id"], []),
        }
        for row in rows
    ]
    return records, ids[-1]


def delete_sessions(engine: Engine, records: list[dict[str, Any]], *, cutoff: float) -> Removed:
    """Delete the archived sessions still idle, with the messages archived with them and their
    owner rows and guard slots, in one transaction.

    A request naming a session at the moment it is deleted could record a call (or a message)
    in it that this transaction did not see; such a session is put back, as archived, at once
    (its calls and messages were never touched: only archived message ids are deleted).
    """
    if not records:
        return Removed()
    by_id = {r["key"]: r for r in records}
    with engine.begin() as conn:
        removed: list[str] = []
        for chunk in chunks(sorted(by_id)):
            result = conn.execute(
                delete(sessions)
                .where(one_of(conn, sessions.c.id, chunk))
                .where(_idle(cutoff))
                .returning(sessions.c.id)
            )
            removed.extend(str(i) for i in result.scalars())
        ids = [m["id"] for s in removed for m in by_id[s]["messages"]]
        dropped = 0
        for chunk in chunks(ids):
            dropped += conn.execute(
                delete(messages).where(one_of(conn, messages.c.id, chunk))
            ).rowcount
        for chunk in chunks(removed):
            conn.execute(
                delete(session_owners).where(one_of(conn, session_owners.c.session_id, chunk))
            )
            conn.execute(
                delete(repeat_guards).where(one_of(conn, repeat_guards.c.session_id, chunk))
            )
    _put_back_if_used(engine, [by_id[s] for s in removed])
    return Removed(sessions=len(removed), messages=dropped)


def _put_back_if_used(engine: Engine, records: list[dict[str, Any]]) -> None:
    ids = [r["key"] for r in records]
    with engine.begin() as conn:
        used: set[str] = set()
        for chunk in chunks(ids):
            for table in (tool_calls, messages):
                query = (
                    select(table.c.session_id)
                    .where(one_of(conn, table.c.session_id, chunk))
                    .distinct()
                )
                used.update(str(s) for s in conn.execute(query).scalars())
        for record in records:
            if record["key"] in used:
                insert_ignore(conn, sessions, **record["session"])


# --- the dry run's session count ---------------------------------------------------------------


def sessions_left_empty(engine: Engine, going: Counter[str], *, cutoff: float) -> tuple[int, int]:
    """Sessions a prune would remove, and their messages not counted with their calls: idle
    ones already, and those whose every call would go (`going`: calls to remove per session)
    with no message from the cutoff on."""
    count = messages_count = 0
    after: str | None = None
    while True:
        records, after = select_sessions(engine, cutoff=cutoff, after=after, limit=IN_CHUNK)
        count += len(records)
        messages_count += sum(len(r["messages"]) for r in records)
        if after is None:
            break
    ids = sorted(going)
    with engine.connect() as conn:
        for chunk in chunks(ids):
            query = (
                select(tool_calls.c.session_id, func.count())
                .where(one_of(conn, tool_calls.c.session_id, chunk))
                .group_by(tool_calls.c.session_id)
            )
            totals = {str(s): int(n) for s, n in conn.execute(query)}
            recent = set(
                conn.execute(
                    select(messages.c.session_id)
                    .where(one_of(conn, messages.c.session_id, chunk))
                    .where(messages.c.created_at >= cutoff)
                    .distinct()
                ).scalars()
            )
            old = set(
                conn.execute(
                    select(sessions.c.id)
                    .where(one_of(conn, sessions.c.id, chunk))
                    .where(sessions.c.created_at < cutoff)
                ).scalars()
            )
            emptied = [
                s for s in chunk if totals.get(s) == going[s] and s not in recent and s in old
            ]
            count += len(emptied)
            if emptied:
                query = (
                    select(func.count())
                    .select_from(messages)
                    .where(one_of(conn, messages.c.session_id, emptied))
                    .where(messages.c.call_key.is_(None))
                )
                messages_count += int(conn.execute(query).scalar_one())
    return count, messages_count
