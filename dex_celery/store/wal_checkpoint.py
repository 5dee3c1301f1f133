"""SQLite's WAL checkpoints, run by a worker's outcome writer beside its writes instead of
inside a commit.

In WAL mode SQLite copies the log back into the database file once the log holds
`wal_autocheckpoint` pages (1,000 by default), and it does so inside whichever commit crossed
that mark: a requester's insert or a recorder's batch then returns only after the copy and its
`fsync`. Those commits are on a call's path; a call writes about 11 pages of log (its insert,
its record, its messages), so one call in ~90 paid for a checkpoint, which is what set
dex-celery's `wait()` p99 on SQLite (docs/benchmarks.md, sections 17 and 18).

The outcome writer (`engine/attempt/outcome_writer.py`: the recorder, or a threads or gevent worker's
writer thread) writes most of the log and knows how much it wrote, so after every
`CHECKPOINT_AFTER` outcomes it has a thread of its own run a `PASSIVE` checkpoint on its own
connection: the log is copied back while other processes go on writing (a passive checkpoint
never waits for, nor holds up, a reader or a writer), and rarely reaches the mark a commit
would checkpoint at. The commits' own checkpoint stays as it was: the backstop wherever no
writer runs, or when this one falls behind.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Engine

log = logging.getLogger("dex_celery.store.wal_checkpoint")

#: Outcomes written between two checkpoints: ~350 pages of log at ~11 per call, so the log is
#: copied back well before the 1,000 pages at which a commit would do it.
CHECKPOINT_AFTER = 32


class WalCheckpointer:
    """One daemon thread with its own connection, woken by `wrote` once enough was written."""

    def __init__(self, engine: Engine, *, after: int = CHECKPOINT_AFTER) -> None:
        self.engine = engine
        self.after = after
        self._since = 0
        self._due = threading.Event()
        self._thread: threading.Thread | None = None
        self._connection: Any = None
        #: Checkpoints run (tests and figures read it).
        self.runs = 0

    @classmethod
    def for_engine(cls, engine: Engine) -> WalCheckpointer | None:
        """A checkpointer for a SQLite database; None for a server database (PostgreSQL
        checkpoints in its own background process already)."""
        return cls(engine) if engine.dialect.name == "sqlite" else None

    def wrote(self, outcomes: int) -> None:
        """`outcomes` were committed; once `after` have been since the last checkpoint, wake
        the thread (only the writer's thread calls this: the count needs no lock)."""
        self._since += outcomes
        if self._since < self.after:
            return
        self._since = 0
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="dex-wal-checkpoint", daemon=True
            )
            self._thread.start()
        self._due.set()

    def _loop(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            self.checkpoint()

    def checkpoint(self) -> None:
        """One `PASSIVE` checkpoint: it copies what no reader still needs and never waits. A
        failure is logged and its connection dropped; the commits' own checkpoint still runs."""
        try:
            if self._connection is None:
                self._connection = self.engine.raw_connection()
            cursor = self._connection.cursor()
            try:
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                cursor.fetchall()
            finally:
                cursor.close()
            self.runs += 1
        except Exception:
            log.warning("a WAL checkpoint failed; the commits checkpoint as before", exc_info=True)
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.invalidate()
