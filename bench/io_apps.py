"""The apps of the IO-bound benchmark (`bench/io_bound.py`): one tool that waits, both sides.

`BENCH_SIDE=plain`: plain Celery tasks `io.sleep` (`time.sleep`) and `io.async_sleep`
(`asyncio.run(asyncio.sleep(...))`, how a plain Celery task runs a coroutine), each `INCR`ing a
counter when done so completion is observable without a result backend.
`BENCH_SIDE=dex`: dex-celery `read` tools `io_sleep` (sync) and `io_async_sleep` (`async def`,
awaited on the worker's event loop). Both sides: JSON, late ack, prefetch 1, no task events.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis
from celery import Celery

from bench.common import announce_ready, broker_pool_from_env
from dex_celery import Dex, EffectClass, Settings, ToolContext, ToolPolicy

SIDE = os.environ.get("BENCH_SIDE", "dex")
BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6399/0")
COUNTER_KEY = "bench:io:done"


def build(settings: Settings, name: str = "bench_io_dex") -> tuple[Celery, Dex]:
    """The dex-celery app: a sync and an async `read` tool that wait `seconds`."""
    celery = Celery(name)
    dx = Dex(celery, settings)

    @dx.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def io_sleep(ctx: ToolContext, seconds: float) -> Any:
        """Waits like a call to a slow HTTP API."""
        time.sleep(seconds)
        return None

    @dx.tool(policy=ToolPolicy(effect=EffectClass.READ))
    async def io_async_sleep(ctx: ToolContext, seconds: float) -> Any:
        """The same wait, awaited."""
        await asyncio.sleep(seconds)
        return None

    return celery, dx


if SIDE == "plain":
    app = Celery("bench_io_plain", broker=BROKER)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    _clients: dict[int, redis.Redis] = {}

    def _done() -> None:
        pid = os.getpid()
        if pid not in _clients:
            _clients.clear()
            _clients[pid] = redis.Redis.from_url(BROKER)
        _clients[pid].incr(COUNTER_KEY)

    @app.task(name="io.sleep")
    def plain_sleep(seconds: float) -> None:
        time.sleep(seconds)
        _done()

    @app.task(name="io.async_sleep")
    def plain_async_sleep(seconds: float) -> None:
        asyncio.run(asyncio.sleep(seconds))
        _done()

else:
    app, dex = build(Settings.from_env())

broker_pool_from_env(app)
announce_ready()
