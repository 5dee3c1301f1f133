"""A worker's warm shutdown, as a deploy makes it (SIGTERM to the main process; docs/reliability.md,
"Deploys: what a worker does on SIGTERM").

Celery's own warm shutdown stops consuming and waits, without a limit, for the tasks its pool
runs. dex-celery adds three things:

- the claim gate (`engine.attempt.shutdown_gate`) shuts at the signal, in every pool process: a delivery
  not yet claimed is handed back to the broker (`Reject(requeue=True)`) instead of starting;
- `hand_back_unstarted`, when the consumer stops: messages the worker holds but never gave to a
  pool process go back to the queue now, not when the worker exits after its running tools;
- `Settings.shutdown_grace` (0: none): once it has passed with tools still running, the worker
  ends them itself, as a SIGKILL would (its pool processes killed, the main process gone), so
  the attempts are judged as after any kill: writes `outcome_unknown`, reads and idempotent
  writes retried elsewhere. A second SIGTERM during the warm shutdown does the same at once.

Celery's soft shutdown (`worker_soft_shutdown_timeout`, Celery 5.5+) is not used: it belongs to
the cold shutdown (SIGQUIT), always sleeps its whole timeout when anything runs, then cancels the
running tasks and requeues their messages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from celery.worker import state

from dex_celery.engine import ShutdownGate

log = logging.getLogger("dex_celery.processes.shutdown")

#: The exit status of a worker that ended its running tools at the end of its grace.
GRACE_EXIT_STATUS = 70  # EX_SOFTWARE


class WarmShutdown:
    """The claim gate and the grace timer of one worker process."""

    def __init__(self, grace: Callable[[], float], spared: Callable[[], int | None]) -> None:
        """`grace`: the settings' `shutdown_grace` (read when the shutdown begins); `spared`:
        the pid of a child that is not a pool process and must outlive the pool (the outcome
        recorder, which writes what it holds and exits once the pool is gone)."""
        self.gate = ShutdownGate()
        self._grace = grace
        self._spared = spared
        self._timer: threading.Timer | None = None
        self._begun = False

    def begin(self) -> None:
        """SIGTERM reached the main process: shut the gate; start the grace timer, if any. A
        second SIGTERM during the warm shutdown ends the worker now, as the grace's end does
        (Celery itself would ignore it). Called in the signal handler: the work is threads'."""
        self.gate.shut()
        if self._begun:
            now = threading.Thread(target=self.end, args=("a second SIGTERM",), daemon=True)
            now.start()
            return
        self._begun = True
        grace = self._grace()
        if grace > 0 and self._timer is None:
            why = f"the shutdown grace of {grace:.1f} s is over"
            self._timer = threading.Timer(grace, self.end, args=(why,))
            self._timer.daemon = True
            self._timer.start()

    def end(self, why: str) -> None:
        """End the worker as a SIGKILL would (the grace is over, or a second SIGTERM came)."""
        running = sorted(str(r.id) for r in tuple(state.active_requests))
        log.warning(
            "%s with %d attempt(s) still running (%s); ending the worker: their leases lapse, "
            "writes become outcome_unknown, reads and idempotent writes are retried",
            why,
            len(running),
            ", ".join(running) or "none",
        )
        spared = self._spared()
        for pid in children_of(os.getpid()):
            if pid != spared:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        logging.shutdown()
        os._exit(GRACE_EXIT_STATUS)


def children_of(pid: int) -> list[int]:
    """The child processes of `pid`, from `/proc` (every thread's list); [] without `/proc`."""
    out: list[int] = []
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for thread in threads:
        try:
            out.extend(int(p) for p in (thread / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return out


def hand_back_unstarted() -> int:
    """Put back in the queue every message this worker holds and no pool process has accepted
    (late acknowledged, so the broker keeps it until then): another worker claims it now. A pool
    process that still gets one meets the shut gate and hands it back itself; the second reject
    is not sent (Celery's request remembers the first). Returns how many were handed back."""
    handed = 0
    active = set(state.active_requests)
    for request in tuple(state.reserved_requests):
        if request in active or request.acknowledged:
            continue
        try:
            request.reject(requeue=True)
        except Exception:  # a broken link: the broker returns it when the connection closes
            log.warning("could not hand back %s now; the broker will at exit", request.id)
            continue
        handed += 1
    if handed:
        log.info("handed %d delivered, unstarted attempt(s) back to the broker", handed)
    return handed
