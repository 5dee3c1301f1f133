"""SQL engines that are safe across Celery's prefork forks."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine, event


def make_engine(url: str) -> Engine:
    """An engine tuned for many processes writing: WAL and a busy timeout for SQLite."""
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

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


class ForkSafeEngine:
    """One engine per process: a pooled connection must never cross a fork (prefork children).

    `on_create` runs once for each new engine (e.g. a service creating its own tables).
    """

    def __init__(self, url: str, *, on_create: Callable[[Engine], None] | None = None) -> None:
        self.url = url
        self._on_create = on_create
        self._engine: Engine | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def get(self) -> Engine:
        if self._engine is None or self._pid != os.getpid():
            with self._lock:
                if self._engine is None or self._pid != os.getpid():
                    if self._engine is not None:
                        self._engine.dispose(close=False)  # the parent's connections stay its own
                    engine = make_engine(self.url)
                    if self._on_create is not None:
                        self._on_create(engine)
                    self._engine, self._pid = engine, os.getpid()
        return self._engine
