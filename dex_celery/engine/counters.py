"""Facts for the metrics that no SQL row or ledger index holds, kept in Redis.

Celery's prefork workers are many processes, so a counter kept in one process's memory would
show only that process's share. Everything the metrics report is therefore read at scrape time
from SQL and Redis (`dex_celery.ops.metrics`); the two facts that exist nowhere else are written
here, each with one cheap command on a rare path:

- a claim refused (a stale or redelivered message turned away, S3.3): one `HINCRBY` on the
  `stats` hash (`KeySpace.stats`), field `claims_refused:<reason>`;
- each sweep's end time, duration and error count: one `HSET` on the `sweep_stats` hash (also
  what `dex-celery status` and the worker's "no sweep" warning read);
- an outcome SQL would not take (the recorder's batch or the sweeper's late write failed): one
  `HINCRBY` on the `stats` hash, field `sql_write_errors:<writer>`, by the outcomes it held.

Failing to count never fails the work it counts: the errors are logged and dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dex_celery.ledger.ledger import Ledger

log = logging.getLogger("dex_celery.engine.counters")

#: Field prefix of refused claims in the `stats` hash.
CLAIMS_REFUSED = "claims_refused:"
#: Field prefix of outcomes SQL would not take, by writer (`recorder`, `sweeper`).
SQL_WRITE_ERRORS = "sql_write_errors:"


def count_refused_claim(ledger: Ledger, reason: str) -> None:
    """One more claim refused for `reason` (`finished`, `stale_attempt`, `already_running`, …)."""
    try:
        ledger.client.hincrby(ledger.keys.stats, CLAIMS_REFUSED + (reason or "unknown"), 1)
    except Exception:  # a metric must never turn a refused claim into a task failure
        log.warning("could not count a refused claim (%s)", reason, exc_info=True)


def count_sql_write_errors(ledger: Ledger, writer: str, outcomes: int = 1) -> None:
    """`outcomes` more outcomes that `writer` could not write to SQL (each stays in the ledger's
    unrecorded index until the sweeper writes it)."""
    try:
        ledger.client.hincrby(ledger.keys.stats, SQL_WRITE_ERRORS + writer, outcomes)
    except Exception:  # the database is the trouble already; Redis may be too
        log.warning("could not count a failed SQL write (%s)", writer, exc_info=True)


def stats_fields(ledger: Ledger) -> dict[str, int]:
    """Every counter of the `stats` hash (one read for all of them)."""
    raw: Any = ledger.client.hgetall(ledger.keys.stats)
    return {str(k): int(v) for k, v in raw.items()}


def with_prefix(fields: dict[str, int], prefix: str) -> dict[str, int]:
    """The counters whose field starts with `prefix`, by the rest of the field."""
    return {k[len(prefix) :]: v for k, v in fields.items() if k.startswith(prefix)}


@dataclass(frozen=True, slots=True)
class SweepStats:
    """The last sweep: when it ended (ledger clock) and how long it took, in seconds."""

    finished_at: float
    duration: float
    errors: int = 0


def record_sweep(ledger: Ledger, started: float, errors: int = 0) -> None:
    """Note a sweep that began at `started` (`time.monotonic()`) and has just ended."""
    duration = time.monotonic() - started
    try:
        ledger.client.hset(
            ledger.keys.sweep_stats,
            mapping={
                "finished_at": repr(ledger.now()),
                "duration": repr(duration),
                "errors": str(errors),
            },
        )
    except Exception:  # the sweep did its work; only its metric is missing
        log.warning("could not record the sweep's duration", exc_info=True)


def last_sweep(ledger: Ledger) -> SweepStats | None:
    raw: Any = ledger.client.hgetall(ledger.keys.sweep_stats)
    if not raw or "finished_at" not in raw:
        return None
    return SweepStats(
        float(raw["finished_at"]), float(raw.get("duration", 0.0)), int(raw.get("errors", 0))
    )
