"""The beat process of a deployment: its startup check and the three threads it owns.

Beat is the one scheduler of a deployment, so dex-celery's periodic work runs in threads of the
beat process instead of as Celery tasks:

- the sweeper (`sweep.run_forever`, every `sweep_interval`): detection of lost workers, expired
  attempts and deadlines never waits for a tool slot (a sweep sent as a task would queue behind
  the tools it watches); `sweep_in_beat=False` leaves it to `dex-celery sweep --loop`;
- the reconcile job (every `reconcile_interval`, S8.4): as a task it would fill Flower's list;
  safe with two runners at once, so a second beat by mistake causes nothing twice;
- the webhook sender, when `webhook_urls` is set;
- the retention job (every `retention_interval`, S12.4), when `retention` is set: a prune of
  the history that ended more than `retention` ago, archived first (`engine/upkeep/retention.py`).

All of them start on Celery's `beat_init` for this Dex's app only. `beat_init` is sent by a
standalone `celery beat` and by an embedded one (`worker -B`, which also sends
`beat_embedded_init`): listening to `beat_init` alone, and starting at most once per process,
gives exactly one of each thread. `BeatServices.stop` (at interpreter exit) stops them all.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery, signals

from dex_celery.engine import RuntimeSource, run_forever
from dex_celery.ops.webhooks import WebhookSender, receivers
from dex_celery.processes.checks import check_or_exit

log = logging.getLogger("dex_celery.processes.beat")

#: How the log names each thread.
_LABELS = {
    "dex-sweeper": "sweeper",
    "dex-reconcile": "reconcile loop",
    "dex-retention": "retention job",
}
#: Seconds beat's shutdown waits for a sweep or a reconcile run in progress to end.
STOP_TIMEOUT = 10.0


class BeatServices:
    """The threads of one beat process; started once, stopped together."""

    def __init__(self, source: RuntimeSource, reconcile_interval: Callable[[], float]) -> None:
        self.source = source
        self.reconcile_interval = reconcile_interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.threads: dict[str, threading.Thread] = {}
        self.webhooks: WebhookSender | None = None

    def start(self) -> None:
        """Start the sweeper, the reconcile loop and the webhook sender; a second call (a
        second signal in the same process) starts nothing."""
        with self._lock:
            if self.threads or self.webhooks is not None:
                return
            # Registered before any thread starts: beat's SIGTERM ends the process through
            # SystemExit, and a signal that lands while this method runs must still stop them.
            atexit.register(self.stop)
            settings = self.source.runtime.settings
            self._stop.clear()
            if settings.sweep_in_beat:
                self._thread("dex-sweeper", self._sweep)
                log.info(
                    "beat: the dex sweeper runs every %.1fs in this process (not as a Celery task)",
                    settings.sweep_interval,
                )
            every = self.reconcile_interval()
            self._thread("dex-reconcile", lambda: self._reconcile(every))
            log.info("dex-celery: reconciling outcome_unknown calls every %.0fs in beat", every)
            if settings.retention is not None:
                self._thread("dex-retention", self._retention)
                log.info(
                    "dex-celery: removing history older than %s every %.0fs in beat (archived "
                    "to %s)",
                    settings.retention,
                    settings.retention_interval,
                    settings.retention_archive,
                )
            if receivers(settings.webhook_urls):
                self.webhooks = WebhookSender(self.source)
                self.webhooks.start()
                log.info("webhooks: sending to %d receiver(s)", len(self.webhooks.urls))

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every thread: the sweep or reconcile run in progress finishes, none starts."""
        self._stop.set()
        with self._lock:
            threads, self.threads = self.threads, {}
            webhooks, self.webhooks = self.webhooks, None
        if webhooks is not None:
            webhooks.stop()
            log.info("beat: the dex webhook sender stopped")
        for name, thread in threads.items():
            thread.join(timeout)
            log.info("beat: the dex %s stopped", _LABELS.get(name, name))

    @property
    def running(self) -> frozenset[str]:
        """Names of the threads alive now (`dex-webhooks` included when it runs)."""
        names = {name for name, thread in self.threads.items() if thread.is_alive()}
        if self.webhooks is not None:
            names.add("dex-webhooks")
        return frozenset(names)

    def _thread(self, name: str, target: Callable[[], None]) -> None:
        # Daemon threads: a beat killed outright leaves nothing behind to wait for.
        thread = threading.Thread(target=target, name=name, daemon=True)
        self.threads[name] = thread
        thread.start()

    def _sweep(self) -> None:
        run_forever(self.source.runtime.sweeper, stop=self._stop)

    def _reconcile(self, interval: float) -> None:
        """One reconciliation every `interval` seconds until stopped."""
        while not self._stop.wait(interval):
            try:
                self.source.runtime.reconciler.run_once()
            except Exception:  # one failed run must not end the loop; the next run retries
                log.exception("reconcile run failed; trying again in %.0fs", interval)

    def _retention(self) -> None:
        """One prune at start, then one every `retention_interval`, until stopped."""
        interval = self.source.runtime.settings.retention_interval
        while True:
            try:
                self.source.runtime.retention.run_once(self._stop.is_set)
            except Exception:  # one failed run must not end the loop; the next run retries
                log.exception("retention run failed; trying again in %.0fs", interval)
            if self._stop.wait(interval):
                return


def connect_beat(
    celery: Celery, source: RuntimeSource, reconcile_interval: Callable[[], float]
) -> BeatServices:
    """Connect the beat side of `celery`'s deployment to Celery's signals (from `Dex`)."""
    services = BeatServices(source, reconcile_interval)

    def on_beat_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not celery:
            return
        check_or_exit(source, "beat")
        services.start()

    signals.beat_init.connect(on_beat_init, weak=False)
    return services
