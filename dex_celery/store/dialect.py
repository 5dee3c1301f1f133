"""What differs between SQL dialects, in one place: INSERT ... ON CONFLICT DO NOTHING."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Connection, String, Table, any_, bindparam, insert
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError


def insert_ignore(conn: Connection, table: Table, **values: Any) -> bool:
    """INSERT that does nothing on a primary-key conflict; True if the row was inserted.

    A plain INSERT caught on IntegrityError would abort a PostgreSQL transaction.
    """
    dialect = conn.dialect.name
    if dialect == "postgresql":
        stmt: Any = pg_insert(table).values(**values).on_conflict_do_nothing()
    elif dialect == "sqlite":
        stmt = sqlite_insert(table).values(**values).on_conflict_do_nothing()
    else:
        try:
            with conn.begin_nested():
                conn.execute(insert(table).values(**values))
            return True
        except IntegrityError:
            return False
    # SQLAlchemy reports an INSERT's rowcount only when asked to (psycopg gives -1 otherwise).
    return bool(conn.execute(stmt.execution_options(preserve_rowcount=True)).rowcount == 1)


#: Keys per `IN (...)` list, well under SQLite's limit of bound parameters.
IN_CHUNK = 500


def one_of(conn: Connection, column: Any, values: Sequence[Any]) -> Any:
    """`column IN (values)`; on PostgreSQL `column = ANY(:array)`, one bound parameter: the
    driver then parses one short statement instead of one with hundreds of placeholders (a
    prune's batches spent a sixth of their time there)."""
    if conn.dialect.name == "postgresql":
        kind = BigInteger() if values and isinstance(values[0], int) else String()
        return column == any_(bindparam(None, list(values), type_=ARRAY(kind)))
    return column.in_(list(values))


def insert_many_ignore(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> set[str]:
    """Multi-row INSERT that skips rows whose key exists; returns the keys it inserted."""
    if not rows:
        return set()
    dialect = conn.dialect.name
    if dialect in ("postgresql", "sqlite"):
        make = pg_insert if dialect == "postgresql" else sqlite_insert
        stmt = make(table).on_conflict_do_nothing().returning(table.c.key)
        return {str(k) for k in conn.execute(stmt, rows).scalars()}
    return {r["key"] for r in rows if insert_ignore(conn, table, **r)}


def upsert(conn: Connection, table: Table, values: dict[str, Any], keys: list[str]) -> Any:
    """INSERT, or on a conflict of `keys` UPDATE the row to `values` (PostgreSQL and SQLite)."""
    make: Any = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    stmt = make(table).values(**values)
    return stmt.on_conflict_do_update(
        index_elements=keys, set_={k: v for k, v in values.items() if k not in keys}
    )
