"""What the Celery processes of a deployment do when they start, beyond running tasks.

- Worker (`worker_init`, in the main process before the pool starts) and beat (`beat_init`)
  check once that Redis keeps acknowledged claims (`dex_celery.ledger.health`): one warning, or
  with `require_durable_redis` a refusal (the process exits with status 1 before taking work).
- Beat runs the sweeper in a thread of its own (`BeatSweeper`), so detection of lost workers,
  expired attempts and deadlines never waits for a tool slot: a sweep sent as a Celery task
  would queue behind the tools it is meant to watch, and with every slot busy it would not run
  at all. Users who run one beat (as S8.4 already asks, for the reconcile job) need nothing new;
  `dex-celery sweep --loop` remains for deployments that prefer a separate process
  (`sweep_in_beat=False` then keeps beat from sweeping too, though two sweepers are harmless:
  every move is compare-and-set).
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from typing import TYPE_CHECKING, Any

import redis
from celery import signals

from dex_celery.engine.sweep import run_forever
from dex_celery.errors import LedgerError
from dex_celery.ledger.connection import describe
from dex_celery.ledger.health import DurabilityReport, UnsafeRedis, check_at_start

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.processes.startup")

#: Seconds beat's shutdown waits for a sweep in progress to end.
STOP_TIMEOUT = 10.0


def check_redis(dex: Dex, component: str) -> DurabilityReport:
    """The startup check of one process (`UnsafeRedis` if required and not met; `LedgerError`
    if Redis does not answer)."""
    where = describe(dex.settings.redis_url)
    try:
        return check_at_start(
            dex.redis,
            where=where,
            require=dex.settings.require_durable_redis,
            claim_replicas=dex.settings.claim_replicas,
            component=component,
        )
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise LedgerError(f"{component}: cannot reach Redis at {where}: {e}") from e


class BeatSweeper:
    """The sweeper loop (`sweep.run_forever`) as a daemon thread of the beat process.

    Stopped at interpreter exit (beat's shutdown): the sweep in progress finishes, no new one
    starts. A daemon thread, so a beat killed outright leaves nothing behind to wait for.
    """

    def __init__(self, dex: Dex) -> None:
        self.dex = dex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=run_forever,
            args=(self.dex.sweeper,),
            kwargs={"stop": self._stop},
            name="dex-sweeper",
            daemon=True,
        )
        self._thread.start()
        atexit.register(self.stop)
        log.info(
            "beat: the dex sweeper runs every %.1fs in this process (not as a Celery task)",
            self.dex.settings.sweep_interval,
        )

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            log.info("beat: the dex sweeper stopped")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def install(dex: Dex) -> None:
    """Connect the startup hooks of `dex` to Celery's signals (called by `Dex.__init__`)."""
    sweeper = BeatSweeper(dex)

    def on_worker_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is dex.celery:
            _or_exit(dex, "worker")

    def on_beat_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not dex.celery:
            return
        _or_exit(dex, "beat")
        if dex.settings.sweep_in_beat:
            sweeper.start()

    signals.worker_init.connect(on_worker_init, weak=False)
    signals.beat_init.connect(on_beat_init, weak=False)


def _or_exit(dex: Dex, component: str) -> None:
    """Run the check; on a refusal, log it and exit: Celery's signal dispatch logs and swallows
    ordinary exceptions from handlers, and the process must not start."""
    try:
        check_redis(dex, component)
    except UnsafeRedis as e:
        log.critical("%s", e)
        sys.exit(1)
    except Exception as e:  # Redis down at start: the process's own retries will say so
        log.warning("%s: could not check Redis's configuration: %s", component, e)
