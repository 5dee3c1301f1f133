"""Readiness and liveness: what a worker's start, its health door and `dex-celery probe` ask.

A worker that only logs "the database is not ready" and then says `ready.` takes messages it
cannot run, and a probe that only pings Celery passes for it (docs/operations.md, "Probes"). So:

- `require_backends` (at a worker's or beat's start, before `ready`; `processes.checks`): the
  database answers and holds dex-celery's schema at a revision this code runs on, and the Redis
  ledger answers; otherwise the typed error (`DatabaseUnavailable`, `SchemaMissing`,
  `SchemaOutdated`, `RedisUnavailable`) and the process exits non-zero;
- `readiness`: the same plus the broker, now, as a verdict that never raises (the worker's
  `/readyz`, `dex-celery probe ready`);
- `LoopTick`: the worker's main loop ticks it from its own timer; `/livez` answers 200 only while
  the last tick is recent (`dex-celery probe live`);
- `require_sweeps`: beat is alive while its sweeper's last sweep (`engine.last_sweep`,
  in the ledger) is younger than `ops.status.stale_after` (`dex-celery probe live --beat`).

A verdict names the parts that failed and their error types only: the doors that show it answer
without credentials, so they show no data (docs/security.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import inspect

from dex_celery.backend_errors import (
    UPGRADE_HINT,
    backend_errors,
    require_existing_database,
    safe_url,
    translate,
)
from dex_celery.engine import (
    last_sweep,
)
from dex_celery.errors import DexError, NotAlive, SchemaMissing, SchemaOutdated
from dex_celery.ops.status import stale_after
from dex_celery.store.schema import tool_calls

if TYPE_CHECKING:
    from dex_celery.engine import RuntimeSource

#: Seconds a readiness check of the broker waits for a connection.
BROKER_TIMEOUT = 5.0
#: Seconds between two ticks of a worker's main loop (`LoopTick`)...
TICK_INTERVAL = 5.0
#: ...and the age of the last tick past which the loop counts as stopped.
TICK_STALE_AFTER = 60.0


def require_database(source: RuntimeSource) -> str:
    """The database answers and its schema is one this code runs on: at the newest revision,
    at a newer one (a newer release migrated it: expand-then-contract, docs/deploy.md), or
    tables made by `create_schema()` without a revision. Returns what was found; raises
    `DatabaseUnavailable`, `SchemaMissing` or `SchemaOutdated`."""
    from dex_celery.store.migrate import current, head, knows  # deferred: Alembic is slow

    settings = source.settings
    url, schema = settings.database_url, settings.database_schema
    with backend_errors(settings.redis_url, url):
        require_existing_database(url)  # a probe never creates a SQLite file
        at, newest = current(url, schema), head()
        if at is None:
            with source.runtime.store.engine.connect() as conn:
                names = inspect(conn).get_table_names(schema=schema)
            if tool_calls.name not in names:
                raise SchemaMissing(
                    f"the database at {safe_url(url)} has no dex-celery schema; {UPGRADE_HINT}"
                )
            return "dex-celery's tables without a migration revision (create_schema())"
        if at != newest and knows(at):
            raise SchemaOutdated(
                f"the database at {safe_url(url)} is at schema revision {at}, this code needs "
                f"{newest}; {UPGRADE_HINT}"
            )
        return f"schema at revision {at}"


def require_ledger(source: RuntimeSource) -> str:
    """The Redis ledger answers a PING; raises `RedisUnavailable` otherwise."""
    settings = source.settings
    with backend_errors(settings.redis_url, settings.database_url):
        source.runtime.redis.ping()
    return "answers"


def require_broker(source: RuntimeSource) -> str:
    """The broker accepts a connection within `BROKER_TIMEOUT`; raises `RedisUnavailable`
    (Kombu's failure, as `backend_errors` names it) otherwise."""
    runtime = source.runtime
    with (
        backend_errors(runtime.settings.redis_url, runtime.settings.database_url),
        runtime.celery.connection_for_write() as conn,
    ):
        conn.ensure_connection(
            max_retries=1, interval_start=0, interval_step=0, timeout=BROKER_TIMEOUT
        )
    return "answers"


def require_backends(source: RuntimeSource) -> None:
    """What a worker or beat needs before it may say it is ready: the database (reachable,
    schema at a revision this code runs on) and the Redis ledger. The first that fails raises
    its typed error."""
    require_database(source)
    require_ledger(source)


#: The parts `readiness` asks, in order.
READINESS_CHECKS: tuple[tuple[str, Callable[[RuntimeSource], str]], ...] = (
    ("database", require_database),
    ("redis", require_ledger),
    ("broker", require_broker),
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a probe found: each part asked, and for each that failed its error's type."""

    parts: tuple[str, ...]
    failed: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failed

    def text(self) -> str:
        """One line without data: `ready (database, redis, broker)` or
        `not ready: database (SchemaMissing)`."""
        if self.ok:
            return f"ready ({', '.join(self.parts)})"
        return "not ready: " + ", ".join(f"{part} ({kind})" for part, kind in self.failed)


def readiness(source: RuntimeSource) -> tuple[Verdict, DexError | None]:
    """Every part of `READINESS_CHECKS` asked now; the verdict and the first failure's error
    (for a command line that prints it)."""
    failed: list[tuple[str, str]] = []
    first: DexError | None = None
    for part, check in READINESS_CHECKS:
        try:
            check(source)
        except Exception as e:
            settings = source.settings
            error = translate(e, redis_url=settings.redis_url, database_url=settings.database_url)
            failed.append((part, type(error or e).__name__))
            first = first or error or DexError(f"{part}: {type(e).__name__}")
    return Verdict(tuple(part for part, _ in READINESS_CHECKS), tuple(failed)), first


class LoopTick:
    """When a worker's main loop last ran a timer of its own (monotonic seconds).

    The worker's timer (`Consumer.timer`: driven by the event loop of a prefork worker's main
    process) calls `tick` every `TICK_INTERVAL`; a blocked or dead loop stops ticking, while
    the health door's thread still answers, so the door can tell."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: float | None = None
        self._lock = threading.Lock()

    def tick(self) -> None:
        with self._lock:
            self._last = self.clock()

    def age(self) -> float | None:
        """Seconds since the last tick; None before the first (the worker is starting)."""
        with self._lock:
            last = self._last
        return None if last is None else max(0.0, self.clock() - last)

    def require_alive(self, stale_after: float = TICK_STALE_AFTER) -> str:
        """Raises `NotAlive` before the first tick or after `stale_after` without one."""
        age = self.age()
        if age is None:
            raise NotAlive("the worker's main loop has not started yet")
        if age > stale_after:
            raise NotAlive(f"the worker's main loop last ticked {age:.0f}s ago")
        return f"the main loop ticked {age:.1f}s ago"


def require_sweeps(source: RuntimeSource) -> str:
    """Beat is alive while its sweeper sweeps: the last sweep recorded in the ledger ended
    within `stale_after(sweep_interval)`. Raises `NotAlive` (or `RedisUnavailable`)."""
    settings = source.settings
    with backend_errors(settings.redis_url, settings.database_url):
        ledger = source.runtime.ledger
        sweep = last_sweep(ledger)
        now = ledger.now()
    limit = stale_after(settings.sweep_interval)
    if sweep is None:
        raise NotAlive("no sweep has ended yet: the sweeper is not running")
    age = max(0.0, now - sweep.finished_at)
    if age > limit:
        raise NotAlive(
            f"the last sweep ended {age:.0f}s ago (more than {limit:g}s): the sweeper stopped"
        )
    return f"the last sweep ended {age:.1f}s ago"
