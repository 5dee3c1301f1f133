"""The reconcile job runs inside the beat process, not as a Celery task.

As a task, `dex.reconcile` would put one entry into Flower's task list every
`reconcile_interval` (and the sweeper's, every `sweep_interval`, far more), pushing the tool
calls operators look for out of Flower's memory. Beat is the one scheduler of a deployment, so
the job runs in a thread of the beat process instead: started on Celery's `beat_init` (or
`worker -B`, which sends it too) for this Dex's app only. Reconciliation is safe with two
runners at once, so a second beat by mistake causes nothing twice. The `dex.reconcile` task
stays registered, without task events, for `celery call dex.reconcile` by hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import signals

from dex_celery.engine.reconcile import reconcile_once

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.processes.beat_jobs")


def reconcile_loop(dex: Dex, stop: threading.Event, interval: float) -> None:
    """Run one reconciliation every `interval` seconds until `stop` is set."""
    while not stop.wait(interval):
        try:
            reconcile_once(dex)
        except Exception:  # one failed run must not end the loop; the next run retries
            log.exception("reconcile run failed; trying again in %.0fs", interval)


def install_beat_jobs(dex: Dex, interval: Callable[[], float]) -> None:
    """Start the reconcile loop in beat processes of `dex.celery` (called by `Dex.__init__`)."""

    def on_beat_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not dex.celery:
            return
        every = interval()
        log.info("dex-celery: reconciling outcome_unknown calls every %.0fs in beat", every)
        thread = threading.Thread(
            target=reconcile_loop,
            args=(dex, threading.Event(), every),
            name="dex-reconcile",
            daemon=True,
        )
        thread.start()

    signals.beat_init.connect(on_beat_init, weak=False)
