"""The outcome recorder alone: CPU per outcome of `OutcomeWriter.write_batch` (what the worker's
`dex-recorder` process runs for each batch it takes from the pool: the SQL transaction and the
ledger's `recorded` pipeline) and the SQL statements each outcome costs.

Calls are requested through the client first (so each has its SQL row and its ledger entry, as
a worker's outcome would find them), then their outcomes are written in batches of each size.
CPU is this process's (`time.process_time`: SQLite's work included, a PostgreSQL server's
not); statements are counted at the driver (`store/statement_trace.py`: SQLite's trace callback,
psycopg's cursor), an `executemany` counting one statement per row, as the database runs them.
The outcomes are mixed like a busy deployment's: most succeed, some fail, some end
`outcome_unknown` with a write budget's charge to settle, each with an attempt log.

    .venv/bin/python -m bench.recorder_cpu --outcomes 2000 --batches 1,20,100
    .venv/bin/python -m bench.recorder_cpu --outcomes 2000 --batches 1,20,100 \
        --database postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import uuid
from collections import Counter
from typing import Any

from bench.common import RedisServer, header, median, workdir
from bench.scrape_cost import database_for
from dex_celery import Settings
from dex_celery.engine.attempt.outcome_writer import OutcomeWriter
from dex_celery.engine.request.dispatch import CallRequest
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.store.statement_trace import trace
from dex_celery.store.values import Outcome, OutcomeRow


def outcome(i: int) -> Outcome:
    """The i-th outcome of the mix: 8 in 10 succeed, 1 fails, 1 ends outcome_unknown."""
    now = time.time()
    log = json.dumps(
        [
            {
                "attempt": 1,
                "state": "ok",
                "owner": "bench@host:1",
                "claimed_at": now - 0.01,
                "ended_at": now,
            }
        ]
    )
    if i % 10 == 8:
        return Outcome(CallStatus.FAILED, "the order does not exist", None, 1, log)
    if i % 10 == 9:
        return Outcome(CallStatus.OUTCOME_UNKNOWN, "the worker was lost", None, 1, log)
    return Outcome(CallStatus.SUCCEEDED, "", json.dumps({"n": i}), 1, log)


def batch_rows(dx: Any, tag: str, size: int) -> list[OutcomeRow]:
    requests = [CallRequest(tag, f"t{i}", "c", "noop", {}) for i in range(size)]
    for start in range(0, size, 100):
        dx.client().request_calls(requests[start : start + 100])
    return [
        OutcomeRow(
            CallKey.of(r.session_id, r.turn_id, r.tool_call_id),
            "noop",
            "{}",
            outcome(i),
        )
        for i, r in enumerate(requests)
    ]


def measure(
    dx: Any, size: int, outcomes: int, seen: Counter[str]
) -> tuple[float, float, float, float]:
    """(median CPU us per outcome of the whole batch, of its SQL transaction alone, SQL
    statements per outcome, driver calls per batch). Batches alternate: the writer's whole
    `write_batch`, then `Store.record_outcomes` alone (the SQL transaction, no ledger)."""
    writer = OutcomeWriter(dx.store, dx.ledger)
    whole: list[float] = []
    sql: list[float] = []
    batches = max(outcomes // size, 6)
    statements = calls = 0
    for b in range(-2, batches):  # two untimed batches first: connections, caches
        rows = batch_rows(dx, f"r{size}x{b + 2}", size)
        seen.clear()
        alone = b % 2 == 1
        t0 = time.process_time()
        if alone:
            dx.store.record_outcomes(rows)
        else:
            writer.write_batch(rows)
        spent = time.process_time() - t0
        if alone:
            dx.ledger.recorded_many([(r.key.key, r.outcome.status.value, "") for r in rows])
        if b >= 0:
            (sql if alone else whole).append(spent / size)
            statements += seen["statements"]
            calls += seen["calls"]
    written = dx.store.get_call(rows[0].key.key)
    assert written is not None and written.status is rows[0].outcome.status, "not recorded"
    per = 1e6
    return median(whole) * per, median(sql) * per, statements / (batches * size), calls / batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outcomes", type=int, default=2000, help="outcomes per batch size")
    parser.add_argument("--batches", default="1,20,100", help="batch sizes")
    parser.add_argument(
        "--database", default="", help="PostgreSQL server URL (default: a SQLite file)"
    )
    args = parser.parse_args(argv)
    header("the outcome recorder's CPU per outcome")
    from bench.dex_app import build

    folder = workdir("recorder")
    server = RedisServer(folder / "redis").start()
    url, drop = database_for(args.database, folder, 0)
    try:
        settings = Settings(
            redis_url=server.url, database_url=url, key_prefix=f"rc{uuid.uuid4().hex[:6]}"
        )
        _app, dx = build(settings, "recorder_bench")
        dx.store.create_schema()
        seen: Counter[str] = Counter()

        def count(sql: str, times: int) -> None:
            seen["statements"] += times
            seen["calls"] += 1

        trace(dx.store.engine, count)
        dx.store.engine.dispose()  # connections from now on are traced
        print(f"database: {dx.store.engine.dialect.name}")
        for size in (int(x) for x in args.batches.split(",")):
            whole, sql, statements, calls = measure(dx, size, args.outcomes, seen)
            print(
                f"batch {size:>4}: recorder cpu {whole:7.1f} us/outcome, of which the SQL "
                f"transaction {sql:7.1f} (medians of batches); {statements:5.2f} SQL "
                f"statements/outcome, {calls:6.1f} driver calls/batch"
            )
        dx.store.engine.dispose()
    finally:
        server.kill()
        drop()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
