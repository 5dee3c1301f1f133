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
import os
import queue
import threading
import time
from typing import TYPE_CHECKING

from dex_celery import tracing
from dex_celery.store.repository import OutcomeRow
from dex_celery.tracing import span

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.recorder")

#: Most outcomes written in one transaction.
MAX_BATCH = 200


class OutcomeWriter:
    """One daemon thread per process (re-made in each prefork child)."""

    def __init__(self, dex: Dex) -> None:
        self.dex = dex
        self.pid = os.getpid()
        self._queue: queue.Queue[OutcomeRow] = queue.Queue()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._thread = threading.Thread(target=self._loop, name="dex-outcome-writer", daemon=True)
        self._thread.start()

    def submit(self, row: OutcomeRow) -> None:
        with self._idle:
            self._in_flight += 1
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
        with span(tracing.RECORD, calls=len(batch)) as traced:
            self.dex.store.record_outcomes(batch)
            self.dex.ledger.recorded_many(
                [(r.key.key, r.outcome.status.value, r.outcome.error) for r in batch]
            )
            if traced.live:
                tracing.recorded((r.key.key, r.outcome.status) for r in batch)


_writers: dict[int, OutcomeWriter] = {}
_writers_lock = threading.Lock()


def outcome_writer(dex: Dex) -> OutcomeWriter:
    """The writer of this process and this Dex."""
    pid = os.getpid()
    with _writers_lock:
        writer = _writers.get(id(dex))
        if writer is None or writer.pid != pid:
            writer = OutcomeWriter(dex)
            _writers[id(dex)] = writer
        return writer


def flush_all(timeout: float = 10.0) -> None:
    """Flush every writer of this process (Celery's worker_process_shutdown)."""
    pid = os.getpid()
    with _writers_lock:
        writers = [w for w in _writers.values() if w.pid == pid]
    for writer in writers:
        if not writer.flush(timeout):
            log.warning("outcomes still unwritten at shutdown; the sweeper will record them")
