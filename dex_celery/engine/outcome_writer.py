"""Writes the outcomes a worker process decides to SQL in batches, off the task's path.

The ledger already holds each decided outcome (and lists it in the unrecorded index) before it
reaches this writer, so the task can return at once: the writer commits whatever has queued up
in one transaction, then releases the batch's ledger entries and announces them
in one pipeline. If the process dies with a batch still queued, nothing is lost: the sweeper
writes any outcome left unrecorded for longer than `Settings.unrecorded_grace` (docs/ledger.md, crash
table, "after finish script, before SQL write").
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from dex_celery.engine import tracing
from dex_celery.engine.pause_points import PausePoint, pause_at
from dex_celery.engine.tracing import span
from dex_celery.store.values import OutcomeRow

if TYPE_CHECKING:
    from dex_celery.ledger.ledger import Ledger
    from dex_celery.store.repository import Store

log = logging.getLogger("dex_celery.engine.outcome_writer")

#: Most outcomes written in one transaction.
MAX_BATCH = 200


class OutcomeWriter:
    """One daemon thread per process, started on the first outcome (one writer per process,
    built by `runtime`; a forked child builds its own)."""

    def __init__(self, store: Store, ledger: Ledger) -> None:
        self.store = store
        self.ledger = ledger
        self._queue: queue.Queue[OutcomeRow] = queue.Queue()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._thread: threading.Thread | None = None

    def submit(self, row: OutcomeRow) -> None:
        with self._idle:
            self._in_flight += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="dex-outcome-writer", daemon=True
                )
                self._thread.start()
        self._queue.put(row)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far is written (worker shutdown, tests)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def _loop(self) -> None:
        while True:
            # No waiting for company: an idle system records each outcome at once, and under
            # load the outcomes that arrive while a batch is being written form the next one.
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write(batch)
            except Exception:
                # Left in the ledger's unrecorded index: the sweeper writes them after its grace.
                log.exception("could not record %d outcomes; the sweeper will", len(batch))
            finally:
                with self._idle:
                    self._in_flight -= len(batch)
                    self._idle.notify_all()

    def _write(self, batch: list[OutcomeRow]) -> None:
        pause_at(PausePoint.BEFORE_RECORD, batch[0].key.key)  # crash tests only
        with span(tracing.RECORD, calls=len(batch)) as traced:
            self.store.record_outcomes(batch)
            self.ledger.recorded_many(
                [(r.key.key, r.outcome.status.value, r.outcome.error) for r in batch]
            )
            if traced.live:
                tracing.recorded((r.key.key, r.outcome.status, r.trace) for r in batch)
