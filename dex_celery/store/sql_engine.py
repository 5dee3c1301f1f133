"""SQL engines that are safe across Celery's prefork forks (reset by `dex_celery.forks`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy.exc
from sqlalchemy import Engine, create_engine, event

from dex_celery.backend_errors import safe_url
from dex_celery.errors import ConfigurationError
from dex_celery.forks import after_fork, keep_inherited
from dex_celery.store.green_sqlite import greenlets_are_threads, one_transaction_at_a_time
from dex_celery.store.statement_trace import trace_from_env


def make_engine(url: str, schema: str | None = None) -> Engine:
    """An engine tuned for many processes writing: WAL and a busy timeout for SQLite.

    With `schema` (PostgreSQL), every table of `dex_celery.store.schema` is read and written
    in that schema through SQLAlchemy's `schema_translate_map`: the table definitions and the
    migrations stay schema-free, and a host application's tables are never touched. A missing
    database driver or an unknown dialect is a `ConfigurationError`, not an ImportError.
    """
    try:
        engine = _create(url)
    except ImportError as e:
        raise ConfigurationError(
            f"the database driver for {safe_url(url)} is not installed ({e}); for PostgreSQL: "
            "pip install 'dex-celery[postgres]'"
        ) from e
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError) as e:
        raise ConfigurationError(f"database URL {safe_url(url)!r} is not usable: {e}") from e
    trace_from_env(engine)  # tests only: inert unless DEX_TESTING_SQL_TRACE is set
    if schema is not None:
        return engine.execution_options(schema_translate_map={None: schema})
    return engine


def _create(url: str) -> Engine:
    if url.startswith("sqlite"):
        # Pooled: opening a SQLite connection (and its PRAGMAs) per transaction cost more than
        # the write itself on the worker's hot path. The pool never crosses a fork (`Store`).
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        if greenlets_are_threads():
            one_transaction_at_a_time(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


class EngineHandle:
    """The engine of this process, made on first use: a pooled connection must never cross a
    fork, so the after-fork hook (`dex_celery.forks`) drops the parent's engine in a child.

    `on_create` runs once for each new engine (e.g. a service creating its own tables).
    """

    def __init__(
        self,
        url: str,
        *,
        on_create: Callable[[Engine], None] | None = None,
        schema: str | None = None,
    ) -> None:
        self.url = url
        self.schema = schema
        self._on_create = on_create
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        after_fork(self._forget)

    def get(self) -> Engine:
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    engine = make_engine(self.url, self.schema)
                    if self._on_create is not None:
                        self._on_create(engine)
                    self._engine = engine
        return self._engine

    def _forget(self) -> None:
        """After a fork: the parent's connections stay its own; this process makes its own.

        A SQLite pool is closed here, at once: SQLite keeps one state per file and process,
        shared by every connection to that file, so the inherited connections kept open would
        lend the child's new ones the parent's locks. Closing takes none of the parent's locks
        (the child holds no lock to release), and it happens now, while the descriptors are
        still the inherited ones, before anything (Celery's embedded beat) closes them and
        hands their numbers to new files. A server database's pool is kept untouched
        (`keep_inherited`): closing it would end the parent's sessions on the shared sockets.
        """
        self._lock = threading.Lock()
        engine, self._engine = self._engine, None
        if engine is None:
            return
        if engine.dialect.name == "sqlite":
            engine.dispose()
        keep_inherited(engine)
