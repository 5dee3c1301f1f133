"""The hot path's SQL, compiled once per engine and run on the DBAPI cursor.

The outcome writer ends a batch of calls with a conditional UPDATE (one per batch on
PostgreSQL, `HotStatements.end_calls`) and one INSERT of their TOOL messages
(`store/many_rows.py`); a write's attempt first commits its claim (the write
fence), one more UPDATE.
Built and compiled through SQLAlchemy Core each time, the statements cost more Python CPU than
the database spends on them (docs/benchmarks.md, section 6). Here each is compiled once for the
engine's dialect (and its PostgreSQL schema, `schema_translate_map`); the statements are still
written in Core, so SQLite and PostgreSQL get their own correct text.

Each then runs on a cursor of the DBAPI connection: inside a SQLAlchemy transaction (`on_cursor`:
the same transaction and connection), or, for the busiest (the recorder's batch, a caller's read
of a record), on a pooled DBAPI connection without a `Connection` around it (`driver_cursor`).
On a machine that idles between calls every layer a statement passes through is paid again with
cold caches, and SQLAlchemy's `Connection.exec_driver_sql` and its result objects were most of a
single outcome's write and of a record's read (docs/benchmarks.md, section 17). What stays: the
pool and its `connect` events (SQLite's PRAGMAs), PostgreSQL's pre-ping, SQLAlchemy's exception
types (a driver error is raised as the `DBAPIError` SQLAlchemy would raise, a lost connection
invalidated), `store/commit.py`'s commit. What does not: statement-level engine events
(`before_cursor_execute`) fire for none of these, nor `commit` for `driver_cursor`'s.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect, Engine, MetaData, bindparam, or_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import Compiled

from dex_celery.model.outcomes import CallStatus
from dex_celery.store.green_sqlite import held
from dex_celery.store.many_rows import ManyRows, joined_update, multi_insert
from dex_celery.store.schema import call_counts, messages, tool_calls


@dataclass(frozen=True, slots=True)
class DriverStatement:
    """One statement's SQL text for one dialect, and how to hand it its parameters."""

    sql: str
    #: Parameter names in the order of the placeholders (positional paramstyles: SQLite's `?`);
    #: None when the driver takes them by name (psycopg's `%(name)s`).
    order: tuple[str, ...] | None
    #: The dialect's conversions of bound values, by parameter (SQLite's `Float`: `float()`).
    convert: tuple[tuple[str, Callable[[Any], Any]], ...] = ()

    @classmethod
    def compile(cls, statement: Any, dialect: Dialect) -> DriverStatement:
        compiled: Compiled = statement.compile(dialect=dialect)
        # Driver SQL skips SQLAlchemy's bind processors: apply the compiled statement's own.
        processors = getattr(compiled, "_bind_processors", {})
        positions = getattr(compiled, "positiontup", None)
        return cls(
            compiled.string,
            tuple(positions) if positions is not None else None,
            tuple(processors.items()),
        )

    def params(self, values: Mapping[str, Any]) -> tuple[Any, ...] | Mapping[str, Any]:
        if self.convert:
            values = dict(values)
            for name, convert in self.convert:
                if values[name] is not None:
                    values[name] = convert(values[name])
        return values if self.order is None else tuple(values[name] for name in self.order)

    def execute(self, conn: Connection | DBAPICursor, values: Mapping[str, Any]) -> int:
        """Run once; the rowcount."""
        with on_cursor(conn) as cursor:
            cursor.execute(self.sql, self.params(values))
            return int(cursor.rowcount)

    def first(self, conn: Connection | DBAPICursor, values: Mapping[str, Any]) -> Any:
        """Run once; the first row it returns (a RETURNING clause's), None if none."""
        with on_cursor(conn) as cursor:
            cursor.execute(self.sql, self.params(values))
            rows = cursor.fetchall()  # every row: SQLite finishes the statement on the last
        return rows[0] if rows else None

    def first_mapping(
        self, conn: Connection | DBAPICursor, values: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Run once; the first row as {column: value}, None if none."""
        with on_cursor(conn) as cursor:
            cursor.execute(self.sql, self.params(values))
            rows = cursor.fetchall()
            names = [column[0] for column in cursor.description or ()]
        return dict(zip(names, rows[0], strict=True)) if rows else None

    def execute_many(
        self, conn: Connection | DBAPICursor, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        params: Any = [self.params(r) for r in rows]  # all tuples or all mappings
        with on_cursor(conn) as cursor:
            cursor.executemany(self.sql, params)


@contextlib.contextmanager
def on_cursor(conn: Connection | DBAPICursor) -> Iterator[DBAPICursor]:
    """A DBAPI cursor in `conn`'s transaction: `conn` itself when it is one (`driver_cursor`
    answers for its errors), else a cursor of the connection's DBAPI connection, whose driver
    errors are raised as SQLAlchemy raises them (a connection the driver says is gone is
    invalidated, as SQLAlchemy would)."""
    if not isinstance(conn, Connection):
        yield conn
        return
    fairy = conn.connection
    cursor: DBAPICursor | None = None
    try:
        cursor = fairy.cursor()
        yield cursor
    except conn.dialect.loaded_dbapi.Error as e:
        raise _translated(e, conn.dialect, fairy.dbapi_connection, cursor, conn.invalidate) from e
    finally:
        if cursor is not None:
            with contextlib.suppress(Exception):
                cursor.close()


@contextlib.contextmanager
def driver_cursor(engine: Engine) -> Iterator[DBAPICursor]:
    """A cursor on a pooled DBAPI connection, in one transaction committed at the end.

    A failure rolls back and is raised as SQLAlchemy raises it (`DBAPIError` and its kinds,
    so `backend_errors` says the same); a connection the driver says is gone is invalidated,
    not handed back to the pool.
    """
    dialect = engine.dialect
    try:
        raw = engine.raw_connection()
    except dialect.loaded_dbapi.Error as e:  # could not connect: nothing to roll back
        raise DBAPIError.instance(None, None, e, dialect.loaded_dbapi.Error, dialect=dialect) from e
    cursor: DBAPICursor | None = None
    try:
        with held(engine, raw):  # a greenlets' process: one transaction at a time
            try:
                cursor = raw.cursor()
                yield cursor
                raw.commit()
            except dialect.loaded_dbapi.Error as e:
                _roll_back(raw)
                raise _translated(e, dialect, raw.dbapi_connection, cursor, raw.invalidate) from e
            except BaseException:
                _roll_back(raw)
                raise
    finally:
        if cursor is not None:
            with contextlib.suppress(Exception):
                cursor.close()
        raw.close()


def _translated(
    error: Any,
    dialect: Dialect,
    dbapi_connection: Any,
    cursor: DBAPICursor | None,
    invalidate: Callable[[BaseException], None],
) -> DBAPIError:
    """`error` (the driver's) as the `DBAPIError` SQLAlchemy would raise; the connection
    invalidated first when the driver says it is gone."""
    gone = dialect.is_disconnect(error, dbapi_connection, cursor)
    if gone:
        invalidate(error)
    translated: DBAPIError = DBAPIError.instance(
        None, None, error, dialect.loaded_dbapi.Error, connection_invalidated=gone, dialect=dialect
    )
    return translated


def _roll_back(raw: Any) -> None:
    with contextlib.suppress(Exception):  # the connection may be gone: the first error stands
        raw.rollback()


@dataclass(frozen=True, slots=True)
class HotStatements:
    #: End a pending call (`CallRecords.record_outcomes`): the compare-and-set on `b_from`
    #: (`pending`), returning the call's key, its effect class (for its count), its write
    #: fence's claim and its write budgets' charges (for its audit entries) only when it ended
    #: here.
    end_pending: DriverStatement
    #: `end_pending` for many calls in one statement (`store/many_rows.py`), on PostgreSQL
    #: only (`end_calls`).
    end_pending_many: ManyRows | None
    #: Their TOOL messages (the columns of `rows.tool_message_row`), in one statement.
    insert_messages: ManyRows
    #: The write fence (`CallRecords.claim_write`): claim a pending call no other attempt holds.
    claim_write: DriverStatement
    #: Add ended calls to their group's count (`store/counts.py`): an upsert.
    count_ended: DriverStatement

    def end_calls(self, cursor: DBAPICursor, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        """`end_pending` for each of `rows` (`b_key`, `b_from`, `b_status`, `b_error`,
        `b_result`, `b_finished_at`, `b_attempts`, `b_attempt_log`; keys distinct): the rows
        the UPDATEs return, in no particular order.

        PostgreSQL ends a batch in one statement: one round trip and one plan instead of one
        per call, a third of the CPU per outcome at 100 a batch. SQLite runs its prepared
        UPDATE per row in the same transaction, cheaper than any statement of many rows (no
        round trip to save; the joined form costs more per row: docs/benchmarks.md, "The
        recorder's SQL"), as does a batch of one on either.
        """
        many = self.end_pending_many
        if many is None or len(rows) == 1:
            found = (self.end_pending.first(cursor, row) for row in rows)
            return [got for got in found if got is not None]
        return many.fetch(cursor, rows)


#: Every column of a message but its generated id and the key of a framework's copy (a TOOL
#: message is never one): what `rows.tool_message_row` fills in.
_MESSAGE_COLUMNS = tuple(
    c.name for c in messages.columns if not c.primary_key and c.name != "mirror_key"
)


def _build(engine: Engine) -> HotStatements:
    calls, msgs, counts = tool_calls, messages, call_counts
    translate = engine.get_execution_options().get("schema_translate_map") or {}
    schema = translate.get(None)
    if schema is not None:  # the tables as the engine's schema_translate_map names them
        copies = MetaData()
        calls, msgs, counts = (
            t.to_metadata(copies, schema=schema) for t in (tool_calls, messages, call_counts)
        )
    end_pending = (
        update(calls)
        .where(calls.c.key == bindparam("b_key"))
        .where(calls.c.status == bindparam("b_from"))
        .values(
            status=bindparam("b_status"),
            error=bindparam("b_error"),
            result=bindparam("b_result"),
            finished_at=bindparam("b_finished_at"),
            attempts=bindparam("b_attempts"),
            attempt_log=bindparam("b_attempt_log"),
        )
        .returning(
            calls.c.key,
            calls.c.effect,
            calls.c.claimed_attempt,
            calls.c.claimed_at,
            calls.c.claimed_by,
            calls.c.budgets,
        )
    )
    claim_write = (
        update(calls)
        .where(calls.c.key == bindparam("b_key"))
        .where(calls.c.status == bindparam("b_from"))
        .where(or_(calls.c.claim_fence.is_(None), calls.c.claim_fence == bindparam("b_fence")))
        .values(
            claim_fence=bindparam("b_fence"),
            claimed_attempt=bindparam("b_attempt"),
            claimed_at=bindparam("b_now"),
            claimed_by=bindparam("b_owner"),
        )
    )
    upsert: Any = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    added = upsert(counts).values(
        tool_name=bindparam("b_tool"),
        effect=bindparam("b_effect"),
        status=bindparam("b_status"),
        shard=bindparam("b_shard"),
        calls=bindparam("b_calls"),
        attempts=bindparam("b_attempts"),
        retries=bindparam("b_retries"),
    )
    count_ended = added.on_conflict_do_update(
        index_elements=[counts.c.tool_name, counts.c.effect, counts.c.status, counts.c.shard],
        set_={
            "calls": counts.c.calls + added.excluded.calls,
            "attempts": counts.c.attempts + added.excluded.attempts,
            "retries": counts.c.retries + added.excluded.retries,
        },
    )
    end_pending_many = None
    if engine.dialect.name == "postgresql":
        ending = ("status", "error", "result", "finished_at", "attempts", "attempt_log")
        joined = joined_update(
            calls,
            match="key",
            guard=("status", CallStatus.PENDING.value),
            sets=ending,
            returning=("key", "effect", "claimed_attempt", "claimed_at", "claimed_by", "budgets"),
            dialect=engine.dialect,
        )
        end_pending_many = joined.named(("b_key", *(f"b_{c}" for c in ending)))
    return HotStatements(
        end_pending=DriverStatement.compile(end_pending, engine.dialect),
        end_pending_many=end_pending_many,
        insert_messages=multi_insert(msgs, _MESSAGE_COLUMNS, engine.dialect),
        count_ended=DriverStatement.compile(count_ended, engine.dialect),
        claim_write=DriverStatement.compile(claim_write, engine.dialect),
    )


_compiled: weakref.WeakKeyDictionary[Engine, HotStatements] = weakref.WeakKeyDictionary()


def hot_statements(engine: Engine) -> HotStatements:
    """The statements compiled for `engine` (once; a new engine after a fork compiles anew).

    No lock: two threads racing on a new engine both compile the same statements, and one
    result is kept (a lock held across a fork would stay held in the child).
    """
    found = _compiled.get(engine)
    if found is None:
        found = _compiled.setdefault(engine, _build(engine))
    return found
