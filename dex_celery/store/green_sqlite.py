"""SQLite in a process whose threads are greenlets (a `-P gevent` or `-P eventlet` worker): one
transaction at a time in the process, handed over by a lock the greenlets can wait on.

SQLite makes a writer that meets another connection's write lock wait in its C busy handler
(`PRAGMA busy_timeout`), and a greenlet waiting there holds the process's only OS thread: no
other greenlet runs until the wait ends. If the greenlet that holds the write lock had yielded
inside its transaction (any network round trip does: the ledger's clock asking Redis for the
time of an audit entry), it never gets to commit, and the waiter fails `database is locked`
after SQLite's 30 s, the whole worker stalled meanwhile. With the lock here a greenlet that
wants a transaction while another greenlet's is open waits on the lock instead, where gevent
switches to the holder, which commits. SQLite writes one transaction at a time anyway; what is
lost is only reads running beside a write within one process.

Other processes' transactions still meet SQLite's busy handler, as before: their holders are
not greenlets of this process, so they commit while this process waits. The wait on the lock is
bounded by the busy timeout: past it the transaction goes on and SQLite's own handling decides,
as it did without the lock (a holder that never commits cannot hold the process forever).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.pool import Pool

#: How long a transaction waits for the process's open one; SQLite's busy timeout.
WAIT_SECONDS = 30.0

#: The key in a pooled connection's `record_info` saying this connection holds the lock.
_HELD = "dex_celery.green_sqlite.held"

#: Each handed-over engine's lock, by its pool (which an engine's `execution_options` copies
#: share with it).
_LOCKS: weakref.WeakKeyDictionary[Pool, Any] = weakref.WeakKeyDictionary()


def greenlets_are_threads() -> bool:
    """gevent or eventlet has patched `threading`: this process's threads are greenlets."""
    gevent = sys.modules.get("gevent.monkey")
    if gevent is not None and gevent.is_module_patched("threading"):
        return True
    eventlet = sys.modules.get("eventlet.patcher")
    return eventlet is not None and bool(eventlet.is_monkey_patched("thread"))


def one_transaction_at_a_time(engine: Engine) -> None:
    """Hand SQLite transactions of `engine` over one at a time, from the transaction's begin to
    its commit or rollback (or the connection's return to the pool, whichever comes first).
    The lock is a `threading.RLock` made while `threading` is patched: a greenlets' lock."""
    lock = threading.RLock()
    _LOCKS[engine.pool] = lock

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        _take(lock, conn.connection.record_info)

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _end(conn: Any) -> None:
        _give(lock, conn.connection.record_info)

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi: Any, record: Any) -> None:
        if record is not None:
            _give(lock, record.record_info)


@contextlib.contextmanager
def held(engine: Engine, raw: Any) -> Iterator[None]:
    """The lock around a transaction on `raw`, a pooled DBAPI connection used without
    SQLAlchemy's begin (`store/hot.py`'s driver cursor); nothing for other engines."""
    lock = _LOCKS.get(engine.pool)
    if lock is None:
        yield
        return
    _take(lock, raw.record_info)
    try:
        yield
    finally:
        _give(lock, raw.record_info)


def _take(lock: Any, info: dict[str, Any]) -> None:
    if info.get(_HELD):
        return
    info[_HELD] = lock.acquire(timeout=WAIT_SECONDS)


def _give(lock: Any, info: dict[str, Any]) -> None:
    if info.pop(_HELD, False):
        with contextlib.suppress(RuntimeError):  # returned by another greenlet (garbage)
            lock.release()
