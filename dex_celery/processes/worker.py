"""The worker process of a deployment: every Celery signal a worker's processes listen to.

- `worker_init` (main process, before the pool starts): the startup check (`processes.checks`:
  the database and its schema, the Redis ledger and its durability; a worker that cannot use
  them exits before `ready`), every tool source read anew (MCP servers' tool lists, so their tasks
  are registered before the pool forks), and the worker's own Prometheus port when `worker_metrics_port` is set, which also
  answers `/readyz` and `/livez` (`processes.health`);
- `worker_ready`: the main loop's tick starts (`ops.probes.LoopTick`, on the consumer's timer);
- `worker_ready`: the node's start is counted (`engine.worker_starts`, restarts in `status`);
- `worker_ready` / `worker_shutting_down`: the deployment watch (`ops.status.DeploymentWatch`:
  a missing schema, a sweeper that stopped), started and stopped with the worker;
- `task_failure` with `WorkerLostError`: the fast path for a pool child that died while its
  parent lives (docs/ledger.md, crash table): the attempt is marked lost now instead of when
  its lease lapses;
- `worker_init` with a gevent, eventlet or threads pool: the broker's connection pools sized for
  the worker's concurrency where left at their defaults (`broker_pools.size_broker_pools`);
- `worker_init` with the prefork pool: the outcome recorder process and the `OutcomeChannel`
  through which the pool processes hand it their outcomes (`forward_outcome`);
- `worker_process_shutdown` / `worker_shutdown`: the outcomes this process still holds are
  written before it exits (the sweeper would, later); the main process first takes what the
  channel still carries; then every tool source lets go of what the process holds open (the
  warm MCP sessions: each server sees its session closed, `integrations/mcp/sessions.py`);
- `worker_shutting_down` (SIGTERM, a deploy): the claim gate shuts in every pool process and
  the shutdown grace starts (`processes.shutdown`); a message of a tool this worker does not
  have is handed back, not dropped (`processes.unknown_tools`, through `services_of`).

Each handler acts only for its own Celery app.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Celery, signals

from dex_celery.engine import OutcomeChannel, RuntimeSource, record_start
from dex_celery.ops.probes import TICK_INTERVAL, LoopTick
from dex_celery.ops.status import DeploymentWatch
from dex_celery.processes.broker_pools import (
    IN_PROCESS_POOLS,
    pool_name,
    size_broker_pools,
    size_ledger_pool,
)
from dex_celery.processes.checks import check_or_exit
from dex_celery.processes.health import health_routes
from dex_celery.processes.shutdown import WarmShutdown
from dex_celery.store.values import OutcomeRow
from dex_celery.tools.tool import TASK_PREFIX

log = logging.getLogger("dex_celery.processes.worker")


class WorkerServices:
    """What one worker process starts and stops besides its tasks."""

    def __init__(
        self,
        celery: Celery,
        source: RuntimeSource,
        refresh_tools: Callable[[], None] = lambda: None,
        close_tools: Callable[[], None] = lambda: None,
    ) -> None:
        self.celery = celery
        self.source = source
        self.refresh_tools = refresh_tools
        self.close_tools = close_tools
        self.watch: DeploymentWatch | None = None
        #: Ticked by the main loop's timer from `worker_ready` on (`/livez`).
        self.tick = LoopTick()
        #: Set on `worker_ready`, cleared when the warm shutdown begins (`/readyz`).
        self.ready = False
        self.channel: OutcomeChannel | None = None
        #: The claim gate (made here, before the pool forks) and the shutdown grace.
        self.shutdown = WarmShutdown(
            lambda: source.settings.shutdown_grace,
            lambda: self.channel.recorder_pid if self.channel is not None else None,
        )

    def _ours(self, sender: Any) -> bool:
        return getattr(sender, "app", None) is self.celery

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        if not self._ours(sender):
            return
        check_or_exit(self.source, "worker")
        # Before the consumer connects: a gevent, eventlet or threads pool's broker pools and
        # ledger client sized for its concurrency (Kombu's 10 connections fail a `gevent -c 200`
        # worker's acks, redis-py's 100 its `finish` calls).
        pool, concurrency = getattr(sender, "pool_cls", None), getattr(sender, "concurrency", None)
        sized: dict[str, int] = size_broker_pools(self.celery, pool, concurrency)
        if pool_name(pool) in IN_PROCESS_POOLS:
            runtime = self.source.runtime
            sized["ledger max_connections"] = size_ledger_pool(
                runtime.ledger.client, pool, concurrency, runtime.settings.redis_url
            )
            log.info("connection pools for the worker's concurrency: %s", sized)
        # Before the pool forks: every MCP server's tool list is read anew and its tools get
        # their tasks here (a server that cannot be reached keeps its kept list, or none).
        self.refresh_tools()
        if _is_prefork(getattr(sender, "pool_cls", None)) and self.channel is None:
            source = self.source
            self.channel = OutcomeChannel(lambda: source.runtime.writer)
        if self.source.runtime.settings.worker_metrics_port:
            # deferred: prometheus_client is an optional dependency (extras `metrics`, `web`)
            from dex_celery.ops.metrics import serve_worker_metrics

            serve_worker_metrics(
                self.source, health_routes(self.source, self.tick, lambda: self.ready)
            )

    def on_worker_ready(self, sender: Any = None, **_: Any) -> None:
        if not self._ours(sender) or self.watch is not None:
            return
        node = getattr(sender, "hostname", None)
        if node:
            record_start(self.source, str(node))  # restarts show in `dex-celery status`
        timer = getattr(sender, "timer", None)
        if timer is not None:  # the consumer's timer: a prefork main process's event loop
            self.tick.tick()
            timer.call_repeatedly(TICK_INTERVAL, self.tick.tick)
        self.ready = True
        self.watch = DeploymentWatch(self.source)
        self.watch.start()

    def on_worker_shutting_down(self, **_: Any) -> None:
        # Sent by the main process's signal handler: no broker I/O here; the consumer hands
        # back what it holds when it stops (`processes.consumer`).
        self.ready = False
        self.shutdown.begin()
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.stop()

    def on_task_failure(
        self,
        sender: Any = None,
        task_id: str | None = None,
        exception: BaseException | None = None,
        **_: Any,
    ) -> None:
        """Celery's parent process reports `WorkerLostError` through `task_failure` when the
        message was not requeued; the attempt is marked lost now."""
        if sender is None or task_id is None or not self._ours(sender):
            return
        if not str(getattr(sender, "name", "")).startswith(TASK_PREFIX):
            return
        if not isinstance(exception, WorkerLostError):
            return
        self.source.runtime.worker.on_worker_lost(task_id, str(exception))

    def forward_outcome(self, row: OutcomeRow) -> bool:
        """A pool process's outcome to the recorder process; False: write it here."""
        channel = self.channel
        return channel is not None and channel.send(row)

    def flush_outcomes(self, **_: Any) -> None:
        """Write the outcomes this process still holds before it exits."""
        channel = self.channel
        if channel is not None and not channel.close():
            log.warning("the outcome recorder was still writing at shutdown; the sweeper will")
        runtime = self.source.built_runtime
        if runtime is not None and not runtime.writer.flush():
            log.warning("outcomes still unwritten at shutdown; the sweeper will record them")

    def close_tool_sources(self, **_: Any) -> None:
        """Close what this process holds open for its tool sources (after its outcomes are
        written): a warm MCP session is ended, not dropped with the process."""
        try:
            self.close_tools()
        except Exception as e:  # a shutdown goes on whatever a source does
            log.warning("closing the tool sources at shutdown failed: %s", e)


def _is_prefork(pool: Any) -> bool:
    """Whether Celery's `pool_cls` (a name or a class, as `worker_init` sees it) forks pool
    processes: `prefork` (alias `processes`), the default."""
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    return name in ("prefork", "processes") or name.endswith("concurrency.prefork")


#: The services of each Celery app, for what Celery calls without a signal (the consumer).
_SERVICES: weakref.WeakKeyDictionary[Celery, WorkerServices] = weakref.WeakKeyDictionary()


def services_of(celery: Celery) -> WorkerServices | None:
    """The worker services connected for `celery` (the last ones), or None."""
    return _SERVICES.get(celery)


def connect_worker(
    celery: Celery,
    source: RuntimeSource,
    refresh_tools: Callable[[], None] = lambda: None,
    close_tools: Callable[[], None] = lambda: None,
) -> WorkerServices:
    """Connect the worker side of `celery`'s deployment to Celery's signals (from `Dex`)."""
    services = WorkerServices(celery, source, refresh_tools, close_tools)
    _SERVICES[celery] = services
    signals.worker_init.connect(services.on_worker_init, weak=False)
    signals.worker_ready.connect(services.on_worker_ready, weak=False)
    signals.worker_shutting_down.connect(services.on_worker_shutting_down, weak=False)
    signals.task_failure.connect(services.on_task_failure, weak=False)
    signals.worker_process_shutdown.connect(services.flush_outcomes, weak=False)
    signals.worker_shutdown.connect(services.flush_outcomes, weak=False)
    signals.worker_process_shutdown.connect(services.close_tool_sources, weak=False)
    signals.worker_shutdown.connect(services.close_tool_sources, weak=False)
    return services
