"""Writes the outcomes a worker decides to SQL in batches, off the task's path.

The ledger already holds each decided outcome (and lists it in the unrecorded index) before it
reaches this writer, so the task can return at once: the writer commits whatever has queued up
in one transaction, then releases the batch's ledger entries and announces them
in one pipeline. If the process dies with a batch still queued, nothing is lost: the sweeper
writes any outcome left unrecorded for longer than `Settings.unrecorded_grace` (docs/ledger.md, crash
table, "after finish script, before SQL write").

With the prefork pool the pool processes do not write at all: each hands its outcome to the
worker's one recorder process through an `OutcomeChannel` (one pipe write), so the SQL
transaction and the `recorded` round trip leave the tool's path and a batch gathers the outcomes
of every pool process. An outcome the channel cannot take (too long for one atomic pipe write,
the pipe full, the recorder gone) is written by the pool process's own writer, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import marshal
import os
import queue
import select
import signal
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dex_celery.engine import counters, tracing
from dex_celery.engine.attempt.pause_points import PausePoint, pause_at
from dex_celery.engine.tracing import span
from dex_celery.forks import after_fork
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.store.values import Outcome, OutcomeRow
from dex_celery.store.wal_checkpoint import WalCheckpointer

if TYPE_CHECKING:
    from dex_celery.ledger.ledger import Ledger
    from dex_celery.store.repository import Store

log = logging.getLogger("dex_celery.engine.attempt.outcome_writer")

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
        #: SQLite's checkpoints, taken off the commits (`store/wal_checkpoint.py`); made at the
        #: first write, so a writer that never writes opens nothing.
        self._checkpointer: WalCheckpointer | None = None
        self._checkpoints_known = False

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
                self.write_batch(batch)
            finally:
                with self._idle:
                    self._in_flight -= len(batch)
                    self._idle.notify_all()

    def write_batch(self, rows: list[OutcomeRow]) -> None:
        """Write `rows` now, in this thread, at most `MAX_BATCH` per transaction (the recorder
        process, which has nothing else to do). What fails stays in the ledger's unrecorded
        index: the sweeper writes it after its grace."""
        for start in range(0, len(rows), MAX_BATCH):
            batch = rows[start : start + MAX_BATCH]
            try:
                self._write(batch)
            except Exception:
                log.exception("could not record %d outcomes; the sweeper will", len(batch))
                counters.count_sql_write_errors(self.ledger, "recorder", len(batch))
                continue
            self._checkpoint_soon(len(batch))

    def _checkpoint_soon(self, written: int) -> None:
        if not self._checkpoints_known:
            self._checkpointer = WalCheckpointer.for_engine(self.store.engine)
            self._checkpoints_known = True
        if self._checkpointer is not None:
            self._checkpointer.wrote(written)

    def _write(self, batch: list[OutcomeRow]) -> None:
        pause_at(PausePoint.BEFORE_RECORD, batch[0].key.key)  # crash tests only
        with span(tracing.RECORD, calls=len(batch)) as traced:
            self.store.record_outcomes(batch)
            self.ledger.recorded_many(
                [(r.key.key, r.outcome.status.value, r.outcome.error) for r in batch]
            )
            if traced.live:
                tracing.recorded((r.key.key, r.outcome.status, r.trace) for r in batch)


#: The recorder's process name (`ps -o comm`), so operators and tools tell it from the pool's.
RECORDER_NAME = "dex-recorder"


def _name_this_process(name: str) -> None:
    """Linux: set this process's `comm`; elsewhere nothing (the name is only for people)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(name)


#: A frame's header: the length of the encoded row that follows (`encode_row`).
_HEADER = struct.Struct("!I")
#: How long the recorder lets outcomes gather before writing, when the previous batch was
#: written less than `GATHER_AFTER` ago (calls are streaming in); an idle recorder writes at
#: once. Seconds.
GATHER = 0.002
GATHER_AFTER = 0.01

#: The pipe's capacity asked for (Linux `F_SETPIPE_SZ`): room for the frames of every pool
#: process while the recorder writes a batch, so a pool process rarely finds it full.
PIPE_SIZE = 1 << 20


def encode_row(row: OutcomeRow) -> bytes:
    """An outcome row as one flat tuple of plain values in `marshal`'s format: a tenth of
    pickling the dataclasses' CPU (1.7 against 16 us per row) on the pool's path. Only between
    a worker's processes, which run the same interpreter (`marshal` is version-specific)."""
    key, outcome = row.key, row.outcome
    return marshal.dumps(
        (
            key.session_id,
            key.turn_id,
            key.tool_call_id,
            row.tool_name,
            row.arguments,
            outcome.status.value,
            outcome.error,
            outcome.result,
            outcome.attempts,
            outcome.attempt_log,
            outcome.did_not_run,
            outcome.decided_at,
            None if row.trace is None else dict(row.trace),
            row.edit,
        )
    )


def decode_row(data: bytes) -> OutcomeRow:
    """`encode_row`'s bytes back as the row (the key was validated where it was parsed)."""
    (
        session,
        turn,
        call,
        tool,
        arguments,
        status,
        error,
        result,
        attempts,
        attempt_log,
        did_not_run,
        decided_at,
        trace,
        edit,
    ) = marshal.loads(data)
    outcome = Outcome(
        CallStatus(status), error, result, attempts, attempt_log, did_not_run, decided_at
    )
    return OutcomeRow(CallKey(session, turn, call), tool, arguments, outcome, trace, edit)


def _frames(buffered: bytes) -> tuple[list[OutcomeRow], bytes]:
    """The whole frames at the start of `buffered`, decoded, and what follows them."""
    rows: list[OutcomeRow] = []
    offset = 0
    while len(buffered) - offset >= _HEADER.size:
        (size,) = _HEADER.unpack_from(buffered, offset)
        end = offset + _HEADER.size + size
        if len(buffered) < end:
            break
        try:
            rows.append(decode_row(buffered[offset + _HEADER.size : end]))
        except Exception:  # the ledger still lists it unrecorded: the sweeper writes it
            log.exception("could not take an outcome from a pool process")
        offset = end
    return rows, buffered[offset:]


def _grow_pipe(fd: int) -> None:
    """Linux: ask for a `PIPE_SIZE` pipe (the default is 64 KiB); elsewhere, or refused (over
    `/proc/sys/fs/pipe-max-size` for an unprivileged user), the pipe keeps its size."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)


#: What the recorder ignores: it stops when the pool's write ends close, after writing.
_IGNORED = {signal.SIGTERM, signal.SIGINT}


class OutcomeChannel:
    """Carries outcomes from a worker's prefork pool processes to one recorder process.

    Built in the worker's main process before the pool forks (`worker_init`): it forks the
    recorder (`dex-recorder`), which writes what it receives with its own `OutcomeWriter`
    (many outcomes, of every pool process, per transaction and per `recorded` pipeline), so
    neither the pool processes nor Celery's main process spend CPU on it. Every pool process
    inherits the pipe's write end and sends a row as one frame in one `write` of at most
    `PIPE_BUF` bytes to a non-blocking pipe, which POSIX makes all or nothing and never
    interleaved with another process's frame: no lock is shared with processes that may be
    SIGKILLed, and a full pipe (a recorder far behind) never holds a task: `send` answers False
    and the caller writes the row itself, as does a pool process whose recorder is gone.

    The recorder ignores SIGTERM and SIGINT and exits once every write end is closed (the pool
    processes gone and `close` called, or the main process dead), after writing what it holds.
    Whatever it had not written when killed is lost to it only: each outcome is in the ledger's
    unrecorded index, and the sweeper writes it after `Settings.unrecorded_grace`.
    """

    def __init__(self, writer: Callable[[], OutcomeWriter]) -> None:
        self._writer = writer
        self._owner = os.getpid()
        #: Whether this process is the one that built the channel (the worker's main process):
        #: cleared in every forked child, so `send` asks no `getpid` per call.
        self._in_owner = True
        self._read, self._write = os.pipe()
        _grow_pipe(self._write)
        os.set_blocking(self._write, False)
        self._forking = True
        after_fork(self._in_child)
        # Held back across the fork, so the recorder ignores them before it can receive one
        # (a group's SIGTERM at the worker's start must not kill it before it is set up).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED)
        try:
            pid = os.fork()
            if pid == 0:
                self._recorder(mask)  # never returns
        finally:
            self._forking = False
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.recorder_pid = pid
        os.close(self._read)
        self._read = -1

    def _in_child(self) -> None:
        self._in_owner = False
        if self._forking:  # the recorder itself: it keeps the read end
            return
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def send(self, row: OutcomeRow) -> bool:
        """In a pool process: hand `row` to the recorder. False when it must be written here
        instead (the main process itself, a row too long for one frame, a full pipe, a
        recorder that is gone)."""
        if self._in_owner or self._write < 0:
            return False
        data = encode_row(row)
        frame = _HEADER.pack(len(data)) + data
        if len(frame) > select.PIPE_BUF:
            return False
        try:
            os.write(self._write, frame)
        except OSError:  # BlockingIOError (full), BrokenPipeError (no recorder)
            return False
        return True

    def _recorder(self, mask: set[int | signal.Signals]) -> None:
        code = 0
        try:
            for signum in _IGNORED:
                signal.signal(signum, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            _name_this_process(RECORDER_NAME)
            os.close(self._write)
            self._write = -1
            writer = self._writer()
            self._loop(writer)
            if not writer.flush(timeout=60):
                log.warning("outcomes unwritten when the recorder stopped; the sweeper will")
        except BaseException:
            log.exception("the outcome recorder failed; the sweeper records what it held")
            code = 1
        finally:
            os._exit(code)

    def _loop(self, writer: OutcomeWriter) -> None:
        """Wait for the pipe, take every frame it holds, write them as one batch, again.

        One thread: no hand-off to a writer thread per frame. An outcome that comes while the
        recorder is idle is written at once. One that comes within `GATHER_AFTER` of the previous
        batch's write (a stream of calls) waits `GATHER` for company first, so under load a
        transaction and a `recorded` pipeline serve many outcomes, not one or two (with two pool
        processes the pipe alone held 1.2 outcomes per wake-up: docs/benchmarks.md, section 15).
        """
        os.set_blocking(self._read, False)
        # `poll`, not `select`: no limit on the descriptor's number.
        readable = select.poll()
        readable.register(self._read, select.POLLIN)
        buffered = b""
        written = float("-inf")
        while True:
            readable.poll()
            if time.monotonic() - written < GATHER_AFTER:
                time.sleep(GATHER)
            buffered, closed = self._drain(buffered)
            rows, buffered = _frames(buffered)
            if rows:
                writer.write_batch(rows)
                written = time.monotonic()
            if closed:
                return

    def _drain(self, buffered: bytes) -> tuple[bytes, bool]:
        """Everything the pipe holds now, after `buffered`; True once every write end closed."""
        while True:
            try:
                chunk = os.read(self._read, 1 << 16)
            except BlockingIOError:
                return buffered, False
            if not chunk:
                return buffered, True
            buffered += chunk

    def close(self, timeout: float = 30.0) -> bool:
        """In the main process at shutdown, once the pool is gone: let the recorder write what
        it holds and wait for it to exit. False if it was still running at `timeout`."""
        if os.getpid() != self._owner or self._write < 0:
            return True
        os.close(self._write)
        self._write = -1
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, _ = os.waitpid(self.recorder_pid, os.WNOHANG)
            except ChildProcessError:  # already reaped
                return True
            if pid:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
