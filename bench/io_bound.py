"""IO-bound throughput: calls of a tool that waits 100 ms, dex-celery against plain Celery.

Same private redis-server, same worker command (`celery worker -P <pool> -c <concurrency>`),
same number of calls, interleaved round by round (plain sync, dex sync, plain async, dex
async, ...). `sync`: `time.sleep(0.1)`; `async`: `asyncio.sleep(0.1)` (plain Celery runs it with
`asyncio.run` inside the task; dex-celery awaits it on the worker process's event loop). Plain
Celery counts completions with an `INCR`; dex-celery is done when every call has its terminal
record (`succeeded`) in SQL. The clock runs from the first publish / request to the last
completion. Reports medians of calls/s and the ratio dex/plain per kind.

    .venv/bin/python -m bench.io_bound --calls 2000 --rounds 3 --pool threads --concurrency 100
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import func, select

from bench.common import BenchWorker, RedisServer, header, median, wait_for, workdir

KINDS = ("sync", "async")
#: Worker CPU seconds per timed run, by (side, kind): the cost that decides throughput on a
#: busy machine, and far less noisy than calls/s.
CPU: dict[tuple[str, str], list[float]] = {}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(worker: Any) -> float:
    """User + system CPU of the worker's main process and its pool children so far."""
    total = 0
    for pid in [worker.pid, *worker.children()]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def _worker(folder: Path, env: dict[str, str], args: argparse.Namespace) -> Any:
    return BenchWorker(
        "bench.io_apps", env, folder, concurrency=args.concurrency, pool=args.pool
    ).start()


def run_plain(folder: Path, url: str, kind: str, args: argparse.Namespace) -> float:
    from celery import Celery

    client_app = Celery("bench_io_client", broker=url)
    client_app.conf.update(task_serializer="json", accept_content=["json"])
    worker = _worker(folder, {"BENCH_SIDE": "plain", "BENCH_BROKER_URL": url}, args)
    r = redis.Redis.from_url(url)
    name = "io.sleep" if kind == "sync" else "io.async_sleep"
    rate = 0.0
    try:
        for n in (args.warmup, args.calls):
            r.set("bench:io:done", 0)
            cpu0 = cpu_seconds(worker)
            t0 = time.perf_counter()
            with client_app.producer_or_acquire() as producer:
                for _ in range(n):
                    client_app.send_task(name, args=(args.seconds,), producer=producer)
            wait_for(
                lambda n=n: int(r.get("bench:io:done") or 0) >= n,
                timeout=600,
                what=f"{n} plain completions",
                interval=0.005,
            )
            rate = n / (time.perf_counter() - t0)
            cpu = (cpu_seconds(worker) - cpu0) / n
        CPU.setdefault(("plain", kind), []).append(cpu)
    finally:
        worker.stop(warm=True)
    return rate


def run_dex(folder: Path, url: str, kind: str, args: argparse.Namespace) -> float:
    from bench.io_apps import build
    from dex_celery import Settings
    from dex_celery.engine.request.dispatch import CallRequest
    from dex_celery.store.schema import tool_calls

    database = f"sqlite:///{folder / 'dex.db'}"
    env = {
        "BENCH_SIDE": "dex",
        "DEX_REDIS_URL": url,
        "DEX_DATABASE_URL": database,
        "DEX_KEY_PREFIX": "bench",
        "DEX_TASK_EVENTS": "0",
    }
    settings = Settings(redis_url=url, database_url=database, key_prefix="bench", task_events=False)
    _app, dx = build(settings, "bench_io_client")
    dx.store.create_schema()
    worker = _worker(folder, env, args)
    tool = "io_sleep" if kind == "sync" else "io_async_sleep"
    client = dx.client()
    rate = 0.0
    try:
        for n in (args.warmup, args.calls):
            session = f"s{uuid.uuid4().hex[:12]}"
            cpu0 = cpu_seconds(worker)
            t0 = time.perf_counter()
            for start in range(0, n, args.batch):
                client.request_calls(
                    [
                        CallRequest(session, f"t{start}", f"c{i}", tool, {"seconds": args.seconds})
                        for i in range(start, min(n, start + args.batch))
                    ]
                )
            query = (
                select(func.count())
                .select_from(tool_calls)
                .where(tool_calls.c.session_id == session, tool_calls.c.status == "succeeded")
            )

            def done(n: int = n, query: Any = query) -> bool:
                with dx.store.engine.connect() as conn:
                    return int(conn.execute(query).scalar_one()) >= n

            wait_for(done, timeout=600, what=f"{n} dex terminal records", interval=0.01)
            rate = n / (time.perf_counter() - t0)
            cpu = (cpu_seconds(worker) - cpu0) / n
        CPU.setdefault(("dex", kind), []).append(cpu)
    finally:
        worker.stop(warm=True)
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=0.1, help="how long each call waits")
    parser.add_argument("--pool", default="threads", choices=("threads", "gevent", "prefork"))
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--batch", type=int, default=50, help="calls per request_calls")
    parser.add_argument("--kinds", default="sync,async")
    parser.add_argument("--sides", default="plain,dex", help="plain, dex or both")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k in KINDS]
    header(f"io_bound: {args.seconds * 1000:.0f} ms tool calls/s, dex-celery vs plain Celery")
    folder = workdir("io")
    server = RedisServer(folder / "redis").start()
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        variants: list[tuple[str, str, Callable[[], float]]] = []
        sides = args.sides.split(",")
        for kind in kinds:
            if "plain" in sides:
                variants.append(
                    ("plain", kind, lambda k=kind: run_plain(folder, server.url, k, args))
                )
            if "dex" in sides:
                variants.append(("dex", kind, lambda k=kind: run_dex(folder, server.url, k, args)))
        for r in range(args.rounds):
            for side, kind, fn in variants:
                rate = fn()
                rates.setdefault((side, kind), []).append(rate)
                print(f"round {r + 1} {side:>5} {kind:>5}: {rate:8.1f} calls/s", flush=True)
    finally:
        server.kill()
    ideal = args.concurrency / args.seconds
    print()
    print(
        f"pool {args.pool} -c {args.concurrency}, {args.calls} calls x {args.rounds} rounds, "
        f"{args.seconds * 1000:.0f} ms per call (ideal {ideal:.0f} calls/s)"
    )
    for kind in kinds:
        if ("plain", kind) not in rates or ("dex", kind) not in rates:
            for (side, k), values in rates.items():
                if k == kind:
                    cpu = median(CPU[(side, k)]) * 1000
                    print(f"{kind:>5}: {side} {median(values):7.1f} calls/s, CPU {cpu:.2f} ms/call")
            continue
        plain, dex = rates[("plain", kind)], rates[("dex", kind)]
        ratios = [d / p for p, d in zip(plain, dex, strict=True)]
        print(
            f"{kind:>5}: plain {median(plain):7.1f} calls/s, dex {median(dex):7.1f} calls/s, "
            f"ratio dex/plain {median(ratios):.2f} (per round "
            + " ".join(f"{x:.2f}" for x in ratios)
            + ")"
        )
        cpu_plain, cpu_dex = median(CPU[("plain", kind)]), median(CPU[("dex", kind)])
        print(
            f"{kind:>5}: worker CPU per call: plain {cpu_plain * 1000:.2f} ms, "
            f"dex {cpu_dex * 1000:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
