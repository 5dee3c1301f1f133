"""Every SQL statement an engine's connections run, seen at the driver (tests and benchmarks).

SQLAlchemy's `before_cursor_execute` event misses the hot path's statements, which run on the
DBAPI cursor (`store/hot.py`), so this watches below it, on each new DBAPI connection: SQLite's
own trace callback (each statement SQLite runs, an `executemany` row included) and, on
PostgreSQL, a psycopg cursor class that reports each statement it sends (an `executemany`
counts one per parameter row: the server runs each).

Inert unless asked: `trace` for an engine in hand (the recorder's benchmark), or
`DEX_TESTING_SQL_TRACE` naming a folder in a process's environment, which makes every engine
`make_engine` builds append each statement to `<folder>/sql-<pid>.log`, one line each (the test
that a pool process runs no SQL for a read call, docs/semantics.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

#: Set to a folder: every engine of the process logs its statements there (`trace_from_env`).
TRACE_ENV = "DEX_TESTING_SQL_TRACE"

#: Called with a statement's text and how many times the database runs it.
Sink = Callable[[str, int], None]


def trace(engine: Engine, sink: Sink) -> None:
    """Report each statement of `engine`'s connections opened from now on to `sink`."""

    @event.listens_for(engine, "connect")
    def _watch(dbapi_conn: Any, _record: Any) -> None:
        if engine.dialect.name == "sqlite":
            dbapi_conn.set_trace_callback(lambda sql: sink(sql, 1))
        else:
            dbapi_conn.cursor_factory = _counting_cursor(dbapi_conn.cursor_factory, sink)


def _counting_cursor(base: Any, sink: Sink) -> Any:
    """A subclass of psycopg's cursor class `base` that reports what it runs to `sink`."""

    class Counting(base):  # type: ignore[misc]
        def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
            sink(str(query), 1)
            return super().execute(query, params, **kw)

        def executemany(self, query: Any, params_seq: Sequence[Any], **kw: Any) -> Any:
            params_seq = list(params_seq)
            sink(str(query), len(params_seq))
            return super().executemany(query, params_seq, **kw)

    return Counting


def trace_from_env(engine: Engine) -> None:
    """`DEX_TESTING_SQL_TRACE` set: log `engine`'s statements to the folder it names."""
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return

    def sink(sql: str, times: int) -> None:
        line = " ".join(sql.split())
        path = Path(folder) / f"sql-{os.getpid()}.log"  # per call: a forked child has its own
        with path.open("a", encoding="utf-8") as out:
            out.write(f"{times}\t{line}\n")

    trace(engine, sink)


def traced_statements(folder: Path, pid: int) -> list[str]:
    """The statements process `pid` logged in `folder`, in order (`trace_from_env`)."""
    path = folder / f"sql-{pid}.log"
    if not path.exists():
        return []
    return path.read_text(encoding="utf-8").splitlines()
