"""The startup check every long-running process makes: do its database and Redis answer, and
does Redis keep acknowledged claims?

Worker and beat check once, before Celery's `ready`: the database answers with dex-celery's
schema at a revision this code runs on, and the Redis ledger answers (`ops.probes`); a process
that cannot use them refuses with one typed error line and exits with status 1, so a
misconfigured worker never says `ready.` (docs/operations.md, "Probes"). Redis's durability
(`dex_celery.ledger.health`): one warning, or with `require_durable_redis` a refusal;
`dex-celery sweep` makes the same durability check.
"""

from __future__ import annotations

import logging
import sys
import time

import redis

from dex_celery.backend_errors import translate
from dex_celery.engine import RuntimeSource
from dex_celery.errors import (
    BackendUnavailable,
    DexError,
    RedisUnavailable,
    SchemaMissing,
    SchemaOutdated,
)
from dex_celery.ledger.connection import describe
from dex_celery.ledger.health import DurabilityReport, check_at_start
from dex_celery.ops.probes import require_backends

log = logging.getLogger("dex_celery.processes.checks")

#: Seconds between two tries of the start's checks while they wait (`startup_wait`).
RETRY_EVERY = 1.0


def check_redis(source: RuntimeSource, component: str) -> DurabilityReport:
    """The durability check of one process (`UnsafeRedis` if required and not met;
    `RedisUnavailable` if Redis does not answer)."""
    runtime = source.runtime
    settings = runtime.settings
    where = describe(settings.redis_url)
    try:
        return check_at_start(
            runtime.redis,
            where=where,
            require=settings.require_durable_redis,
            claim_replicas=settings.claim_replicas,
            component=component,
        )
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise RedisUnavailable(f"{component}: cannot reach Redis at {where}: {e}") from None


def check_or_exit(source: RuntimeSource, component: str) -> None:
    """Run the checks; on a refusal, log one line naming the error's type and exit with status
    1: Celery's signal dispatch logs and swallows ordinary exceptions from handlers, and the
    process must not start. A database or Redis that does not answer is asked again for up to
    `Settings.startup_wait` seconds first (a deployment whose services start together)."""
    settings = source.settings
    deadline = time.monotonic() + settings.startup_wait
    waiting = False
    while True:
        try:
            require_backends(source)
            check_redis(source, component)
            return
        except Exception as e:
            error = translate(e, redis_url=settings.redis_url, database_url=settings.database_url)
            refusal: BaseException = error if isinstance(error, DexError) else e
        left = deadline - time.monotonic()
        if _may_come_up(refusal) and left > 0:
            if not waiting:
                log.warning(
                    "%s: waiting up to %.0fs for its database and Redis: %s",
                    component,
                    left,
                    _one_line(refusal),
                )
                waiting = True
            time.sleep(min(RETRY_EVERY, left))
            continue
        log.critical(
            "%s does not start: %s: %s", component, type(refusal).__name__, _one_line(refusal)
        )
        sys.exit(1)


def _may_come_up(error: BaseException) -> bool:
    """A service that does not answer yet may; a missing or old schema, an unsafe Redis, a
    bad setting will not by waiting."""
    return isinstance(error, BackendUnavailable) and not isinstance(
        error, SchemaMissing | SchemaOutdated
    )


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or "no detail"
