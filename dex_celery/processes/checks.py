"""The startup check every long-running process makes: does Redis keep acknowledged claims?

Worker and beat check once (`dex_celery.ledger.health`): one warning, or with
`require_durable_redis` a refusal (the process exits with status 1 before taking work);
`dex-celery sweep` makes the same check.
"""

from __future__ import annotations

import logging
import sys

import redis

from dex_celery.engine.runtime import RuntimeSource
from dex_celery.errors import LedgerError
from dex_celery.ledger.connection import describe
from dex_celery.ledger.health import DurabilityReport, UnsafeRedis, check_at_start

log = logging.getLogger("dex_celery.processes.checks")


def check_redis(source: RuntimeSource, component: str) -> DurabilityReport:
    """The startup check of one process (`UnsafeRedis` if required and not met; `LedgerError`
    if Redis does not answer)."""
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
        raise LedgerError(f"{component}: cannot reach Redis at {where}: {e}") from e


def check_or_exit(source: RuntimeSource, component: str) -> None:
    """Run the check; on a refusal, log it and exit: Celery's signal dispatch logs and swallows
    ordinary exceptions from handlers, and the process must not start."""
    try:
        check_redis(source, component)
    except UnsafeRedis as e:
        log.critical("%s", e)
        sys.exit(1)
    except Exception as e:  # Redis down at start: the process's own retries will say so
        log.warning("%s: could not check Redis's configuration: %s", component, e)
