"""The broker's connection pools of a worker, sized for its concurrency (docs/operations.md,
"Worker pools and the broker's connections").

Kept apart from `celery_config` (the options every app gets at build time): the concurrency is
known only when a worker starts, at `worker_init`, before its consumer connects.
"""

from __future__ import annotations

from celery import Celery

#: Kombu's own defaults: the Redis transport's connection pool per channel (`max_connections`)
#: and Celery's broker pool (`broker_pool_limit`). Ten each: enough for a prefork worker, whose
#: main process alone talks to the broker, not for a gevent or threads pool of hundreds of
#: tasks acknowledging and publishing at once.
KOMBU_MAX_CONNECTIONS = 10
CELERY_BROKER_POOL_LIMIT = 10
#: Pools whose tasks run in the worker's main process, each holding a broker connection while
#: it acknowledges (late ack) or publishes: their pools are sized for the concurrency.
IN_PROCESS_POOLS = frozenset({"gevent", "eventlet", "threads", "thread"})


def pool_name(pool: object) -> str:
    """Celery's `pool_cls` as `worker_init` sees it (a name, an alias or a class) -> a name:
    `gevent`, `eventlet`, `threads`, `solo`, `prefork`."""
    if isinstance(pool, str):
        return pool
    module = str(getattr(pool, "__module__", ""))
    return module.rsplit(".", 1)[-1] if module.startswith("celery.concurrency") else module


def size_broker_pools(app: Celery, pool: object, concurrency: int | None) -> dict[str, int]:
    """Size the broker's connection pools for a worker of `concurrency` tasks at once on an
    in-process pool (gevent, eventlet, threads), where the user left them at their defaults.

    With Kombu's default of 10 Redis connections, a `gevent -c 200` worker fails its late acks
    with `MaxConnectionsError` (docs/benchmarks.md, section 14): the message of an attempt that
    ran is then delivered again (its claim is refused) or, acked early, lost to the ledger's
    sweeper. Both pools get `2 x concurrency` (acks and the publishes of retries and events at
    once) unless set: a `max_connections` in `broker_transport_options`, a `broker_pool_limit`
    other than Celery's default. Prefork and solo are left alone (one thread talks to the
    broker). Called at `worker_init`, before the consumer connects. Returns what it set.
    """
    if pool_name(pool) not in IN_PROCESS_POOLS or not concurrency:
        return {}
    wanted = 2 * int(concurrency)
    changed: dict[str, int] = {}
    options = dict(app.conf.broker_transport_options or {})
    if "max_connections" not in options and wanted > KOMBU_MAX_CONNECTIONS:
        options["max_connections"] = wanted
        app.conf.broker_transport_options = options
        changed["max_connections"] = wanted
    limit = app.conf.broker_pool_limit
    if limit == CELERY_BROKER_POOL_LIMIT and wanted > limit:
        app.conf.broker_pool_limit = wanted
        changed["broker_pool_limit"] = wanted
    return changed


def size_ledger_pool(client: object, pool: object, concurrency: int | None, url: str) -> int:
    """Raise the ledger client's connection limit to `2 x concurrency` on an in-process pool.

    Each running task holds one ledger connection for its `claim` or `finish` round trip
    (`ledger/hot.py`); redis-py's pool refuses more than its `max_connections` (100 by default
    in redis-py 8) with `MaxConnectionsError`, so 200 greenlets finishing at once spin in the
    worker's retry of `finish` until connections come back. A limit given in the Redis URL
    (`?max_connections=`) is the user's and is kept, and a limit is never lowered. Returns the
    limit in force (0: the client has no such pool, e.g. a cluster client).
    """
    connections = getattr(client, "connection_pool", None)
    limit = getattr(connections, "max_connections", None)
    if not isinstance(limit, int):
        return 0
    if pool_name(pool) not in IN_PROCESS_POOLS or not concurrency or "max_connections=" in url:
        return limit
    wanted = 2 * int(concurrency)
    if wanted > limit:
        connections.max_connections = wanted  # type: ignore[union-attr]
        return wanted
    return limit
