"""The request's SQL, compiled once per engine and run on the DBAPI cursor (as `store/hot.py`
does for the outcome's).

A request's transaction reads the session's default effect class and inserts the call
(`CallRecords.insert_calls`), and a caller's `wait` reads the record back (`get_call`). Built and
compiled through SQLAlchemy Core each time, these statements cost the requester more Python CPU
than the database spends on them (docs/benchmarks.md, section 16). Here each is compiled once
for the engine's dialect (and its PostgreSQL schema) and run on the cursor of the request's own
transaction (`store/hot.py`, `on_cursor`). Only SQLite and PostgreSQL, whose
`ON CONFLICT DO NOTHING ... RETURNING` the insert uses; other dialects keep the Core path
(`store/dialect.py`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from sqlalchemy import Engine, MetaData, bindparam, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from dex_celery.store.hot import DriverStatement
from dex_celery.store.schema import sessions, tool_calls

#: The columns a request writes (the keys of each row `CallRecords.insert_calls` builds, in
#: this order); a row with other keys takes the Core path.
REQUEST_COLUMNS = (
    "key",
    "session_id",
    "turn_id",
    "tool_call_id",
    "tool_name",
    "arguments",
    "sealed_arguments",
    "effect",
    "requires_approval",
    "policy",
    "status",
    "attempts",
    "ledger_epoch",
    "requested_at",
    "approval_deadline",
    "repeat_digest",
    "trace_context",
)


@dataclass(frozen=True, slots=True)
class RequestStatements:
    #: The session's default effect class: `SELECT default_effect FROM sessions WHERE id = ?`.
    session_default: DriverStatement
    #: One call, unless its key is recorded: `INSERT ... ON CONFLICT DO NOTHING RETURNING key`.
    insert_call: DriverStatement
    #: One call's record by key (`CallRecords.get_call`: what `DexClient.wait` returns).
    get_call: DriverStatement


def _build(engine: Engine) -> RequestStatements | None:
    dialect = engine.dialect.name
    if dialect not in ("sqlite", "postgresql"):
        return None
    calls, sess = tool_calls, sessions
    translate = engine.get_execution_options().get("schema_translate_map") or {}
    schema = translate.get(None)
    if schema is not None:  # the tables as the engine's schema_translate_map names them
        copies = MetaData()
        calls, sess = (t.to_metadata(copies, schema=schema) for t in (tool_calls, sessions))
    make = pg_insert if dialect == "postgresql" else sqlite_insert
    insert_call = (
        make(calls)
        .values({c: bindparam(c) for c in REQUEST_COLUMNS})
        .on_conflict_do_nothing()
        .returning(calls.c.key)
    )
    session_default = select(sess.c.default_effect).where(sess.c.id == bindparam("b_id"))
    get_call = select(calls).where(calls.c.key == bindparam("b_key"))
    return RequestStatements(
        session_default=DriverStatement.compile(session_default, engine.dialect),
        insert_call=DriverStatement.compile(insert_call, engine.dialect),
        get_call=DriverStatement.compile(get_call, engine.dialect),
    )


_compiled: weakref.WeakKeyDictionary[Engine, RequestStatements | None] = weakref.WeakKeyDictionary()


def request_statements(engine: Engine) -> RequestStatements | None:
    """The statements compiled for `engine` (once), None for a dialect without them. No lock,
    as `hot.hot_statements`: racing threads compile the same text and one is kept."""
    if engine in _compiled:
        return _compiled[engine]
    return _compiled.setdefault(engine, _build(engine))
