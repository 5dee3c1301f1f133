"""Throughput: end-to-end no-op tool calls per second, dex-celery against plain Celery.

Three variants in the same run, on the same private redis-server, each with the same worker
command (`celery worker -P prefork -c 2`), interleaved round by round (A, B, dex, A, B, dex...):

- A    plain Celery, no result backend; the task INCRs a counter so completion is observable;
- B    plain Celery with a Redis result backend and `task_track_started`, waiting on results;
- dex  a `read` no-op tool, requested through `DexClient.request_calls` in batches of one turn,
       done when every call has its terminal record (`succeeded`) in SQL.

Only one worker runs at a time (each variant starts its own and stops it after its run, outside
the timed part). Reports medians of calls/s and their ratios, per-call Redis commands (from
`INFO commandstats` deltas) and SQL commits per call (client: a SQLAlchemy listener; workers:
the same listener in each pool process, `bench/dex_app.py`).

    .venv/bin/python -m bench.throughput --calls 3000 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import event, func, select

from bench.common import (
    BenchWorker,
    CeleryWorker,
    RedisServer,
    commandstats,
    header,
    median,
    pin_driver,
    process_cpu,
    redis_cpu,
    spawn_elsewhere,
    start_worker,
    stats_delta,
    wait_for,
    workdir,
)


@dataclass
class Run:
    variant: str
    calls: int
    seconds: float
    commands: dict[str, int]
    client_commits: int = 0
    #: CPU seconds redis-server spent during the timed part (scripts, Celery's commands, events).
    redis_cpu: float = 0.0
    #: CPU seconds of the rest during the timed part: (driver, worker main process, pool).
    cpu: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def rate(self) -> float:
        return self.calls / self.seconds


@contextlib.contextmanager
def cpu_meter(server: redis.Redis, worker: CeleryWorker) -> Iterator[dict[str, Any]]:
    """CPU seconds each part spends inside the block: redis-server, the driver, the worker."""
    assert worker.process is not None
    pid = worker.process.pid
    out: dict[str, Any] = {}
    redis0, driver0, (main0, pool0) = redis_cpu(server), time.process_time(), process_cpu(pid)
    yield out
    main1, pool1 = process_cpu(pid)
    out["redis"] = redis_cpu(server) - redis0
    out["cpu"] = (time.process_time() - driver0, main1 - main0, pool1 - pool0)


@dataclass
class Setup:
    folder: Path
    server: RedisServer
    database_url: str
    concurrency: int
    batch: int
    task_events: bool = False
    pool: str = "prefork"
    runs: list[Run] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def plain_env(self, backend: bool) -> dict[str, str]:
        return {
            "BENCH_BROKER_URL": self.url,
            "BENCH_RESULT_BACKEND": self.url if backend else "",
            "BENCH_ACKS_LATE": "1",
            "BENCH_TASK_EVENTS": "1" if self.task_events else "0",
        }

    def dex_env(self) -> dict[str, str]:
        return {
            "DEX_REDIS_URL": self.url,
            "DEX_DATABASE_URL": self.database_url,
            "DEX_KEY_PREFIX": "bench",
            "BENCH_SQL_COUNT_DIR": str(self.folder / "sql"),
            "DEX_TASK_EVENTS": "1" if self.task_events else "0",
            **({"DEX_BUDGETS": os.environ[BUDGETS_ENV]} if os.environ.get(BUDGETS_ENV) else {}),
        }


def _worker(setup: Setup, module: str, env: dict[str, str]) -> CeleryWorker:
    return start_worker(
        BenchWorker(module, env, setup.folder, concurrency=setup.concurrency, pool=setup.pool)
    )


def run_plain(setup: Setup, calls: int, *, backend: bool, warmup: int) -> Run:
    """Plain Celery: publish `calls` no-ops, then wait for their completion."""
    import importlib
    import os

    os.environ.update(setup.plain_env(backend))
    import bench.plain_app as plain

    plain = importlib.reload(plain)  # re-read the backend setting
    worker = _worker(setup, "bench.plain_app", setup.plain_env(backend))
    client = redis.Redis.from_url(setup.url)
    try:
        _plain_batch(plain, client, warmup, backend)
        before = commandstats(client)
        with cpu_meter(client, worker) as cpu:
            t0 = time.perf_counter()
            _plain_batch(plain, client, calls, backend)
            seconds = time.perf_counter() - t0
        delta = stats_delta(before, commandstats(client))
    finally:
        worker.stop(warm=True)
    variant = "B" if backend else "A"
    return Run(variant, calls, seconds, delta, redis_cpu=cpu["redis"], cpu=cpu["cpu"])


def _plain_batch(plain: Any, client: redis.Redis, n: int, backend: bool) -> None:
    client.set(plain.COUNTER_KEY, 0)
    results = [plain.noop.delay() for _ in range(n)]
    if backend:
        for r in results:
            r.get(timeout=120)
            r.forget()
        return
    wait_for(
        lambda: int(client.get(plain.COUNTER_KEY) or 0) >= n,
        timeout=120,
        what=f"{n} plain completions",
        interval=0.005,
    )


def run_dex(setup: Setup, calls: int, *, warmup: int) -> Run:
    dx = _dex(setup)
    worker = _worker(setup, "bench.dex_app", setup.dex_env())
    client = redis.Redis.from_url(setup.url)
    commits = {"n": 0}

    def count(_conn: Any) -> None:
        commits["n"] += 1

    try:
        _dex_batch(dx, warmup, setup.batch)
        before = commandstats(client)
        event.listen(dx.store.engine, "commit", count)
        with cpu_meter(client, worker) as cpu:
            t0 = time.perf_counter()
            _dex_batch(dx, calls, setup.batch)
            seconds = time.perf_counter() - t0
        event.remove(dx.store.engine, "commit", count)
        delta = stats_delta(before, commandstats(client))
    finally:
        worker.stop(warm=True)
    return Run(
        "dex",
        calls,
        seconds,
        delta,
        client_commits=commits["n"],
        redis_cpu=cpu["redis"],
        cpu=cpu["cpu"],
    )


_dexes: dict[str, Any] = {}


#: Write budgets the dex side's calls draw on (`DEX_BUDGETS` syntax), e.g.
#: `bench: tools=noop limit=1000000000 scope=deployment window=day`; unset: none.
BUDGETS_ENV = "BENCH_BUDGETS"


def _dex(setup: Setup) -> Any:
    """The client-side Dex (one per run), with the benchmark's settings."""
    if "dex" not in _dexes:
        from bench.dex_app import build
        from dex_celery import Settings

        settings = Settings(
            redis_url=setup.url,
            database_url=setup.database_url,
            key_prefix="bench",
            task_events=setup.task_events,
            # Write budgets on the `noop` calls (docs/benchmarks.md, section 20): their cost.
            budgets=os.environ.get(BUDGETS_ENV) or None,
        )
        _app, dx = build(settings, "bench_client")
        dx.store.create_schema()
        _dexes["dex"] = dx
    return _dexes["dex"]


def _dex_batch(dx: Any, n: int, batch: int) -> None:
    """Request `n` no-op calls in turns of `batch`, then wait until every one is recorded.

    Done is counted as plain Celery's side counts its INCRs: from Redis, here the
    `tool_call_finished` events of this session's calls (each written by `recorded` after the
    call's SQL record committed), read as they come; then one SQL count confirms that all `n`
    records are `succeeded`. (Polling SQL for the count every 10 ms cost the driver about as
    much CPU as the requests.)"""
    from dex_celery.engine.request.dispatch import CallRequest
    from dex_celery.store.schema import tool_calls

    session = f"s{uuid.uuid4().hex[:12]}"
    client = dx.client()
    position = dx.events.latest_position()
    for start in range(0, n, batch):
        turn = f"t{start // batch}"
        client.request_calls(
            [
                CallRequest(session, turn, f"c{i}", "noop", {})
                for i in range(start, min(n, start + batch))
            ]
        )
    prefix = f"{session}/"
    finished: set[str] = set()
    deadline = time.monotonic() + 300
    while len(finished) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(finished)} of {n} dex calls recorded after 300 s")
        for e in dx.events.read(position, count=1000, block=0.5):
            position = e.position
            if e.type == "tool_call_finished" and e.key.startswith(prefix):
                finished.add(e.key)
    query = (
        select(func.count())
        .select_from(tool_calls)
        .where(tool_calls.c.session_id == session, tool_calls.c.status == "succeeded")
    )
    with dx.store.engine.connect() as conn:
        recorded = int(conn.execute(query).scalar_one())
    if recorded != n:
        raise AssertionError(f"{recorded} of {n} dex calls succeeded in SQL")


@contextlib.contextmanager
def database(kind: str, folder: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'dex.db'}"
        return
    from devtools.pg_schema import postgres_schema

    with postgres_schema() as url:
        yield url


def per_call(run: Run) -> str:
    total = sum(run.commands.values())
    top = sorted(run.commands.items(), key=lambda kv: -kv[1])[:8]
    parts = ", ".join(f"{k} {v / run.calls:.2f}" for k, v in top)
    return f"{total / run.calls:.2f} commands/call ({parts})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--batch", type=int, default=50, help="calls per request_calls (one turn)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--task-events",
        action="store_true",
        help="Celery task events (Flower) on for both plain Celery and dex-celery",
    )
    parser.add_argument(
        "--driver-cpu",
        type=int,
        default=None,
        help="run this driver on that CPU only, Redis and the workers on the others (taskset)",
    )
    args = parser.parse_args(argv)
    pin_driver(args.driver_cpu)
    header("throughput: no-op calls/s, dex-celery vs plain Celery")
    folder = workdir("throughput")
    (folder / "sql").mkdir()
    with spawn_elsewhere():
        server = RedisServer(folder / "redis").start()
    try:
        with database(args.database, folder) as url:
            setup = Setup(
                folder, server, url, args.concurrency, args.batch, task_events=args.task_events
            )
            variants: list[tuple[str, Callable[[], Run]]] = [
                ("A", lambda: run_plain(setup, args.calls, backend=False, warmup=args.warmup)),
                ("B", lambda: run_plain(setup, args.calls, backend=True, warmup=args.warmup)),
                ("dex", lambda: run_dex(setup, args.calls, warmup=args.warmup)),
            ]
            for r in range(args.rounds):
                for _name, fn in variants:
                    run = fn()
                    setup.runs.append(run)
                    print(f"round {r + 1} {run.variant:>3}: {run.rate:8.1f} calls/s")
            report(setup, args)
    finally:
        server.kill()
    return 0


def report(setup: Setup, args: argparse.Namespace) -> None:
    rates = {v: [r.rate for r in setup.runs if r.variant == v] for v in ("A", "B", "dex")}
    med = {v: median(x) for v, x in rates.items()}
    ratios_a = [d / a for a, d in zip(rates["A"], rates["dex"], strict=True)]
    ratios_b = [d / b for b, d in zip(rates["B"], rates["dex"], strict=True)]
    print()
    print(
        f"database {args.database}, {args.calls} calls x {args.rounds} rounds, batch {args.batch}, "
        f"task events {'on' if args.task_events else 'off'} (both sides)"
    )
    for v, label in (
        ("A", "plain, no result backend"),
        ("B", "plain, Redis result backend + track_started"),
        ("dex", "dex-celery read no-op, terminal record in SQL"),
    ):
        print(f"median {v:>3}: {med[v]:8.1f} calls/s  ({label})")
    print(f"ratio dex/A: median of rounds {median(ratios_a):.2f} (per round {_fmt(ratios_a)})")
    print(f"ratio dex/B: median of rounds {median(ratios_b):.2f} (per round {_fmt(ratios_b)})")
    last = {r.variant: r for r in setup.runs}
    for v in ("A", "B", "dex"):
        print(f"redis {v:>3}: {per_call(last[v])}")
    for v in ("A", "B", "dex"):
        runs = [r for r in setup.runs if r.variant == v]
        n = sum(r.calls for r in runs)
        redis_us = sum(r.redis_cpu for r in runs) / n * 1e6
        driver, main_, pool = (sum(r.cpu[i] for r in runs) / n * 1e6 for i in range(3))
        print(
            f"cpu us/call {v:>3}: total {redis_us + driver + main_ + pool:6.0f} = redis "
            f"{redis_us:5.0f} + driver {driver:5.0f} + worker main {main_:5.0f} + pool {pool:5.0f}"
        )
    dex_runs = [r for r in setup.runs if r.variant == "dex"]
    client_commits = sum(r.client_commits for r in dex_runs) / sum(r.calls for r in dex_runs)
    worker_commits = sum(int(p.read_text()) for p in (setup.folder / "sql").glob("commits-*"))
    worker_calls = sum(r.calls for r in dex_runs) + args.warmup * len(dex_runs)
    print(
        f"sql commits/call: client {client_commits:.3f} (one transaction per batch of "
        f"{args.batch}), workers {worker_commits / worker_calls:.3f}"
    )


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
