"""Scrape cost against history: one Prometheus scrape of `/metrics` (the collector the web app
and the worker's metrics port serve) with 1,000 and with 1,000,000 finished calls recorded, and
what ending calls costs the outcome writer now that it keeps their counts.

History is written in bulk, straight to SQL (`dex_tool_calls` rows in terminal statuses), and
counted the way the writers count it (`store/counts.py`, one upsert per group per batch). A
scrape reads the maintained counts and the partial indexes of open calls, so history should not
move its cost; the grouped scan it replaced (`count_by_outcome_scan`) is timed beside it.
The write cost is `Store.record_outcomes` of batches of 20 outcomes, with the counts kept and
with their upsert switched off (both in this run, interleaved: a ratio, not a figure alone).

    .venv/bin/python -m bench.scrape_cost --history 1000,1000000
    .venv/bin/python -m bench.scrape_cost --history 1000,1000000 \
        --database postgresql+psycopg://postgres@127.0.0.1:5432/test

Each history size has its own database and key prefix, and the scrapes of the sizes are timed
interleaved (one of each per round), so a change in the machine's load moves both alike.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

from bench.common import RedisServer, header, median, workdir
from bench.sweep_cost import CHUNK, template
from dex_celery import Settings
from dex_celery.engine.request.dispatch import CallRequest
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.ops.metrics import registry_for
from dex_celery.store import calls as store_calls
from dex_celery.store.counts import count_ended
from dex_celery.store.hot import hot_statements
from dex_celery.store.schema import tool_calls
from dex_celery.store.values import Outcome, OutcomeRow
from dex_celery.store.views import OperatorViews

STATUSES = ("succeeded", "failed", "outcome_unknown", "rejected")


def add_history(dx: Any, tmpl: dict[str, Any], start: int, count: int) -> None:
    now = time.time()
    hot = hot_statements(dx.store.engine)
    with dx.store.engine.begin() as conn:
        for base in range(start, start + count, CHUNK):
            rows = []
            for i in range(base, min(start + count, base + CHUNK)):
                session = f"h{i // 100}"
                rows.append(
                    {
                        **tmpl,
                        "key": f"{session}/t{i % 100}/c",
                        "session_id": session,
                        "turn_id": f"t{i % 100}",
                        "tool_call_id": "c",
                        "status": STATUSES[i % 4],
                        "attempts": 1 + i % 3,
                        "requested_at": now - 3600 + i * 1e-6,
                        "finished_at": now - 3000 + i * 1e-6,
                    }
                )
            conn.execute(insert(tool_calls), rows)
            ended = [(r["tool_name"], r["effect"], r["status"], r["attempts"]) for r in rows]
            count_ended(conn, hot, ended)


def timed(fn: Any, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def write_cost(dx: Any, batches: int, size: int) -> tuple[float, float]:
    """Median seconds per outcome of `record_outcomes`, with counts kept and without."""
    client = dx.client()
    keep: list[float] = []
    skip: list[float] = []
    real = store_calls.count_ended
    for b in range(-2, batches):  # two untimed batches first: connections, caches
        requests = [CallRequest(f"w{b + 2}", f"t{i}", "c", "noop", {}) for i in range(size)]
        client.request_calls(requests)
        rows = [
            OutcomeRow(
                CallKey.of(r.session_id, r.turn_id, r.tool_call_id),
                "noop",
                "{}",
                Outcome(CallStatus.SUCCEEDED, "", "null", attempts=1),
            )
            for r in requests
        ]
        counted = b % 2 == 0
        store_calls.count_ended = real if counted else (lambda *_: None)  # type: ignore[assignment]
        try:
            t0 = time.perf_counter()
            dx.store.record_outcomes(rows)
            if b >= 0:
                (keep if counted else skip).append((time.perf_counter() - t0) / size)
        finally:
            store_calls.count_ended = real
    return median(keep), median(skip)


def database_for(base: str, folder: Path, target: int) -> tuple[str, Any]:
    """A database of its own per history size: a SQLite file, or a fresh PostgreSQL database
    on the server of `base` (dropped by the returned callable)."""
    if not base:
        return f"sqlite:///{folder / f'dex-{target}.db'}", lambda: None
    url = make_url(base)
    name = f"dex_scrape_{target}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url.set(database=name).render_as_string(hide_password=False), drop


def upsert_cost(store: Any, repeat: int) -> float:
    """Median seconds of `count_ended` for a batch of 20 outcomes of one tool (the upsert the
    outcome writer adds to its transaction), rolled back each time."""
    hot = hot_statements(store.engine)
    ended = [("noop", "read", "succeeded", 1)] * 20
    times = []
    for _ in range(repeat):
        with store.engine.connect() as conn, conn.begin() as tx:
            t0 = time.perf_counter()
            count_ended(conn, hot, ended)
            times.append(time.perf_counter() - t0)
            tx.rollback()
    return median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", default="1000,1000000", help="finished calls, ascending")
    parser.add_argument("--repeat", type=int, default=30, help="scrapes timed per size")
    parser.add_argument("--scan-repeat", type=int, default=3, help="grouped scans timed per size")
    parser.add_argument(
        "--write-batches", type=int, default=200, help="outcome batches timed (0: none)"
    )
    parser.add_argument("--upsert-repeat", type=int, default=300, help="count upserts timed")
    parser.add_argument(
        "--database", default="", help="PostgreSQL server URL (default: SQLite files)"
    )
    args = parser.parse_args(argv)
    header("scrape cost against history")
    from bench.dex_app import build

    folder = workdir("scrape")
    server = RedisServer(folder / "redis").start()
    drops: list[Any] = []
    try:
        sizes = [int(x) for x in args.history.split(",")]
        deployments: dict[int, Any] = {}
        for target in sizes:
            url, drop = database_for(args.database, folder, target)
            drops.append(drop)
            settings = Settings(
                redis_url=server.url,
                database_url=url,
                key_prefix=f"sc{uuid.uuid4().hex[:6]}",
            )
            _app, dx = build(settings, f"scrape_bench_{target}")
            dx.store.create_schema()
            tmpl = template(dx)
            t0 = time.perf_counter()
            add_history(dx, tmpl, 1, target - 1)  # and the template's own call
            if dx.store.engine.dialect.name == "postgresql":
                with dx.store.engine.connect() as conn:
                    conn.execute(text("ANALYZE"))
            print(f"  wrote history of {target:,} calls in {time.perf_counter() - t0:.1f}s")
            views = OperatorViews(dx.store)
            assert sorted(views.count_by_outcome(), key=str) == sorted(
                views.count_by_outcome_scan(), key=str
            ), "maintained counts differ from the grouped scan"
            registry = registry_for(dx)
            generate_latest(registry)  # warm
            deployments[target] = (dx, registry, views)
        # Interleaved, one scrape of each size per round: the machine's load moves both alike.
        times: dict[int, list[float]] = {t: [] for t in sizes}
        sql: dict[int, list[float]] = {t: [] for t in sizes}
        for _ in range(args.repeat):
            for target in sizes:
                dx, registry, views = deployments[target]
                times[target] += timed(lambda r=registry: generate_latest(r), 1)
                sql[target] += timed(lambda v=views: (v.count_by_outcome(),
                                                      v.count_unreported_unknowns()), 1)  # fmt: skip
        for target in sizes:
            views = deployments[target][2]
            scans = timed(views.count_by_outcome_scan, args.scan_repeat)
            print(
                f"history {target:>9,}: scrape median {median(times[target]) * 1e3:7.2f} ms  "
                f"p90 {statistics.quantiles(times[target], n=10)[-1] * 1e3:7.2f} ms  "
                f"(of which the call counts {median(sql[target]) * 1e3:.2f} ms; "
                f"{args.repeat} scrapes); the grouped scan it replaced: "
                f"{median(scans) * 1e3:.2f} ms"
            )
        first, last = sizes[0], sizes[-1]
        ratio = median(times[last]) / median(times[first])
        print(
            f"ratio {last:,} / {first:,}: {ratio:.2f} "
            f"({'ok' if ratio <= 1.5 else 'MISSES'} target <= 1.5)"
        )
        store = deployments[last][0].store
        upserts = upsert_cost(store, args.upsert_repeat)
        print(
            f"count upsert alone (one group, a batch of 20 outcomes): {upserts * 1e6:.1f} us "
            f"per batch (median of {args.upsert_repeat}, inside a transaction)"
        )
        if args.write_batches:
            keep, skip = write_cost(deployments[last][0], args.write_batches, 20)
            print(
                f"record_outcomes, batches of 20: {keep * 1e6:.1f} us/outcome with counts kept, "
                f"{skip * 1e6:.1f} us/outcome without; ratio {keep / skip:.2f}"
            )
        for dx, _, _ in deployments.values():
            dx.store.engine.dispose()
    finally:
        server.kill()
        for drop in drops:
            drop()
        shutil.rmtree(folder, ignore_errors=True)  # a million-call SQLite file is 0.5 GB
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
