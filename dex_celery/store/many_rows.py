"""Statements that carry many rows in one: a multi-row INSERT, and the outcome batch's UPDATE
joined to a `VALUES` list.

The recorder's batch ended each call with its own UPDATE and inserted its TOOL messages and
audit entries with `executemany`, which the database runs as one statement per row (psycopg
pipelines them, SQLite steps a prepared statement per row): five statements per outcome
(docs/benchmarks.md, "The recorder's SQL"). Here a batch's rows go in one statement per table:
the SQL text is made for the number of rows (a row's placeholders repeated), the parameters
flattened in that order, and the statement run on a DBAPI cursor like the hot path's others
(`store/hot.py`, `on_cursor`).

The UPDATE takes the rows as a `WITH v(...) AS (VALUES ...)` table joined to the target; its
placeholders carry their column's type (a `VALUES` list has no target column to infer one
from). PostgreSQL alone uses it: SQLite runs it (3.33 and later) but spends more per row on it
than on its prepared one-row UPDATE (`HotStatements.end_calls`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Column, Dialect, Table
from sqlalchemy.engine.interfaces import DBAPICursor

#: Most parameters in one statement: under SQLite's limit (32,766 since 3.32) and PostgreSQL's
#: (65,535); a longer batch runs as several statements in the same transaction.
MAX_PARAMETERS = 30_000


@dataclass(frozen=True, slots=True)
class ManyRows:
    """One statement's text for any number of rows, and how to flatten their parameters."""

    head: str
    #: One row's placeholders, e.g. `(?, ?, ?)`; repeated, comma-separated, after `head`.
    group: str
    tail: str
    #: Parameter names in a group's order.
    columns: tuple[str, ...]
    #: The dialect's conversions of bound values, by position in a group (SQLite's `Float`).
    convert: tuple[tuple[int, Callable[[Any], Any]], ...]
    #: Parameters after the rows' (the UPDATE's guard), in order.
    after: tuple[Any, ...] = ()

    def named(self, names: Sequence[str]) -> ManyRows:
        """The same statement taking each row's parameters by `names` (in `columns`' order)."""
        return replace(self, columns=tuple(names))

    @property
    def most_rows(self) -> int:
        return max(1, (MAX_PARAMETERS - len(self.after)) // len(self.columns))

    def sql(self, rows: int) -> str:
        return self.head + ", ".join([self.group] * rows) + self.tail

    def params(self, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        flat: list[Any] = []
        columns = self.columns
        for row in rows:
            flat += [row[name] for name in columns]
        if self.convert:
            width = len(columns)
            for start in range(0, len(flat), width):
                for at, convert in self.convert:
                    value = flat[start + at]
                    if value is not None:
                        flat[start + at] = convert(value)
        return flat + list(self.after)

    def execute(self, cursor: DBAPICursor, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run for `rows` on `cursor`: one statement per `most_rows`."""
        for chunk in self._chunks(rows):
            cursor.execute(self.sql(len(chunk)), self.params(chunk))

    def fetch(self, cursor: DBAPICursor, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Run for `rows` on `cursor`; every row the statements return (a RETURNING
        clause's), in no particular order."""
        found: list[Any] = []
        for chunk in self._chunks(rows):
            cursor.execute(self.sql(len(chunk)), self.params(chunk))
            found += cursor.fetchall()  # every row: SQLite finishes the statement on the last
        return found

    def _chunks(self, rows: Sequence[Mapping[str, Any]]) -> list[Sequence[Mapping[str, Any]]]:
        most = self.most_rows
        return [rows[start : start + most] for start in range(0, len(rows), most)]


def _placeholder(dialect: Dialect) -> str:
    """The driver's positional placeholder: SQLite's `?`, psycopg's `%s`."""
    return "?" if dialect.paramstyle == "qmark" else "%s"


def _converters(
    columns: Sequence[Column[Any]], dialect: Dialect
) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
    found = []
    for at, column in enumerate(columns):
        processor = column.type.bind_processor(dialect)
        if processor is not None:
            found.append((at, processor))
    return tuple(found)


def multi_insert(table: Table, names: Sequence[str], dialect: Dialect) -> ManyRows:
    """`INSERT INTO table (names) VALUES (...), (...)`: no RETURNING, nothing reads it."""
    prepare = dialect.identifier_preparer
    mark = _placeholder(dialect)
    columns = [table.c[name] for name in names]
    head = (
        f"INSERT INTO {prepare.format_table(table)} "
        f"({', '.join(prepare.format_column(c) for c in columns)}) VALUES "
    )
    group = "(" + ", ".join([mark] * len(columns)) + ")"
    return ManyRows(head, group, "", tuple(names), _converters(columns, dialect))


def joined_update(
    table: Table,
    *,
    match: str,
    guard: tuple[str, Any],
    sets: Sequence[str],
    returning: Sequence[str],
    dialect: Dialect,
) -> ManyRows:
    """`UPDATE table SET sets... FROM the rows WHERE match = the row's AND guard RETURNING`:
    each row updates the one row its `match` names, only where the guard column still holds
    the guard's value. A row's parameters: `match`, then `sets`, by these names. The rows'
    keys must be distinct (a target row joined to two rows takes either's values)."""
    prepare = dialect.identifier_preparer
    mark = _placeholder(dialect)
    names = (match, *sets)
    columns = [table.c[name] for name in names]
    target = prepare.format_table(table)
    quoted = [prepare.format_column(c) for c in columns]
    if dialect.name == "postgresql":  # a VALUES list has no column to take a type from
        marks = [f"CAST({mark} AS {c.type.compile(dialect)})" for c in columns]
    else:
        marks = [mark] * len(columns)
    guard_column = prepare.format_column(table.c[guard[0]])
    head = f"WITH v ({', '.join(quoted)}) AS (VALUES "
    tail = (
        f") UPDATE {target} SET "
        + ", ".join(f"{q} = v.{q}" for q in quoted[1:])
        + f" FROM v WHERE {target}.{quoted[0]} = v.{quoted[0]} "
        + f"AND {target}.{guard_column} = {mark} RETURNING "
        + ", ".join(f"{target}.{prepare.format_column(table.c[r])}" for r in returning)
    )
    group = "(" + ", ".join(marks) + ")"
    return ManyRows(head, group, tail, names, _converters(columns, dialect), (guard[1],))
