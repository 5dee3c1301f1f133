"""The worker's side of an attempt: claim, heartbeat, run, finish, record.

The claim happens before any tool code; a refused claim raises Celery's `Ignore`, so a stale or
redelivered message is acknowledged and dropped without running (S3.2, S3.3).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore

from dex_celery.dispatch import outcome_of
from dex_celery.errors import DexError
from dex_celery.ids import CallKey, parse_task_id
from dex_celery.invoke import invoke_attempt, stored_arguments
from dex_celery.ledger.ledger import Cause, Ledger, StepKind
from dex_celery.recorder import outcome_writer
from dex_celery.store.repository import OutcomeRow, arguments_json
from dex_celery.tools import Tool, ToolContext

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.worker")


class HeartbeatPump:
    """One thread per worker process renews the leases of every attempt it runs (S3.4).

    One script call per beat for all running attempts keeps the cost off the per-call path.
    An attempt found fenced (timed out, presumed lost) gets `cancelled` and is no longer renewed.
    """

    def __init__(self, ledger: Ledger, interval: float) -> None:
        self.ledger = ledger
        self.interval = interval
        self._running: dict[str, tuple[str, ToolContext, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, key: str, fence: str, ctx: ToolContext, heartbeat_timeout: float) -> None:
        with self._lock:
            self._running[key] = (fence, ctx, heartbeat_timeout)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="dex-heartbeat", daemon=True
                )
                self._thread.start()

    def remove(self, key: str) -> None:
        with self._lock:
            self._running.pop(key, None)

    def beat(self, key: str) -> bool:
        """Renew one attempt now (a tool's own heartbeat); False if it was fenced."""
        with self._lock:
            entry = self._running.get(key)
        if entry is None:
            return False
        fenced = self.ledger.heartbeat([(key, entry[0])])
        if key in fenced:
            self._fence({key})
            return False
        return True

    def _fence(self, keys: set[str]) -> None:
        with self._lock:
            for key in keys:
                entry = self._running.pop(key, None)
                if entry is not None:
                    entry[1].cancel()
                    log.warning("attempt of %s was fenced; the tool is told to stop", key)

    def _next_interval(self) -> float:
        """A third of the shortest heartbeat timeout among the running attempts' policies."""
        with self._lock:
            shortest = min((hb for _, _, hb in self._running.values()), default=self.interval * 3)
        return min(self.interval, shortest / 3)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._next_interval())
            with self._lock:
                batch = [(k, fence) for k, (fence, _, _) in self._running.items()]
            if not batch:
                continue
            try:
                self._fence(self.ledger.heartbeat(batch))
            except Exception:  # a Redis blip must not kill the thread; the lease has slack
                log.exception("heartbeat failed; retrying in %.1fs", self.interval)


_pumps: dict[int, HeartbeatPump] = {}
_pumps_lock = threading.Lock()


def heartbeat_pump(dex: Dex) -> HeartbeatPump:
    """The pump of this process (re-made in each prefork child)."""
    pid = os.getpid()
    with _pumps_lock:
        pump = _pumps.get(pid)
        if pump is None or pump.ledger is not dex.ledger:
            pump = HeartbeatPump(dex.ledger, dex.settings.heartbeat_timeout / 3)
            _pumps.clear()
            _pumps[pid] = pump
        return pump


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_attempt(
    dex: Dex,
    tool: Tool,
    key: str,
    attempt: int,
    arguments: str | dict[str, Any],
    sealed: str | None = None,
) -> None:
    """Body of every `dex.tool.<name>` task (how the tool is invoked: `dex_celery.invoke`)."""
    call = CallKey.parse(key)
    fence = uuid.uuid4().hex
    claim = dex.ledger.claim(key, attempt, owner=owner_id(), fence=fence)
    if not claim.ok:
        log.warning("attempt %d of %s not run: claim refused (%s)", attempt, key, claim.reason)
        raise Ignore()
    pump = heartbeat_pump(dex)
    ctx = ToolContext(call, attempt, beat=lambda: pump.beat(key))
    pump.add(key, fence, ctx, claim.heartbeat_timeout)
    try:
        cause, payload = invoke_attempt(
            dex, tool, ctx, arguments, sealed, start_to_close=claim.start_to_close
        )
    finally:
        pump.remove(key)
    step = dex.ledger.finish(key, attempt, fence=fence, cause=cause, payload=payload)
    if step.kind is StepKind.LATE or step.late_result:
        # Fenced, or past start-to-close: the outcome stands; this is evidence only (S5.2).
        log.warning("attempt %d of %s finished too late; kept as a late result", attempt, key)
        dex.store.record_late_result(
            key, json.dumps({"attempt": attempt, "cause": cause.value, "payload": payload})
        )
    result = payload if cause is Cause.OK else None
    if step.kind is StepKind.FINISHED:
        # The ledger holds the outcome now; SQL gets it in the next batch of this process.
        row = OutcomeRow(
            call, tool.name, arguments_json(stored_arguments(arguments)), outcome_of(step, result)
        )
        outcome_writer(dex).submit(row)
    elif step.kind is StepKind.RETRY:
        # A retry (rare) reads the policy snapshot back from SQL; the common path costs nothing.
        dex.dispatcher.apply(key, step, result=result)


def on_worker_lost(dex: Dex, task_id: str, detail: str) -> None:
    """Mark the attempt of a dead pool child lost now (or expired, if it died before its claim)."""
    try:
        call, attempt = parse_task_id(task_id)
    except DexError:
        log.warning("WorkerLostError for a task id that is not ours: %r", task_id)
        return
    step = dex.ledger.lose(
        call.key, attempt, worker_lost=True, detail=f"the pool process died: {detail}"
    )
    log.warning("pool process running %s died; ledger step: %s", task_id, step.kind.value)
    dex.dispatcher.apply(call.key, step)
