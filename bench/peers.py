"""Peers: dex-celery, plain Celery and DBOS side by side, on the same PostgreSQL, in one run.

Throughput (no-op calls/s, interleaved round by round: plain, dex, DBOS, plain, dex, DBOS ...):

- plain  plain Celery without a result backend (variant A of `bench/throughput.py`);
- dex    a `read` no-op through `DexClient.request_calls`, done at its terminal record in SQL,
         on PostgreSQL (a private schema);
- DBOS   a durable queue (`bench/dbos_app.py`: one worker process, `--dbos-concurrency`
         workflows at a time, polled every `--dbos-poll` s), one no-op step per workflow,
         enqueued from this process through `DBOSClient`, done when every workflow is
         `SUCCESS` in its system database (the same PostgreSQL server, a schema of its own).

Idle latency (request to recorded outcome, samples alternating one by one, every worker up):
dex-celery `request_call` then `DexClient.wait` (it returns the SQL record), plain Celery
`delay().get()` with a Redis
result backend, DBOS `enqueue(...).get_result()` polling every `--dbos-poll` s.

Without the `dbos` package (`pip install -e '.[bench]'`) DBOS is skipped with a message and the
rest still runs.

    .venv/bin/python -m bench.peers --calls 1000 --rounds 3 --samples 200
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from bench.common import (
    ROOT,
    BenchWorker,
    RedisServer,
    header,
    median,
    percentile,
    spawn_elsewhere,
    start_worker,
    wait_for,
    workdir,
)
from bench.latency import dex_wait_sample
from bench.throughput import Run, Setup, _dex, cpu_meter, run_dex, run_plain

#: The message printed (and the variant left out) when DBOS is not installed.
SKIP_MESSAGE = (
    "DBOS skipped: the `dbos` package is not installed "
    "(pip install -e '.[bench]'); measuring dex-celery and plain Celery only"
)


def dbos_available() -> bool:
    try:
        importlib.import_module("dbos")
    except ImportError:
        return False
    return True


def _plain_url(url: str) -> str:
    """The same server and database for DBOS, without dex's driver name or search path."""
    base = url.split("?", 1)[0]
    return base.replace("postgresql+psycopg://", "postgresql://", 1)


@dataclass
class DbosPeer:
    """The DBOS side: its worker process, the driver's client and the system database."""

    folder: Path
    url: str
    concurrency: int
    poll: float
    schema: str = field(default_factory=lambda: f"dex_bench_dbos_{uuid.uuid4().hex[:10]}")
    process: subprocess.Popen[bytes] | None = None
    _client: Any = None
    _engine: Engine | None = None

    def env(self) -> dict[str, str]:
        return {
            "BENCH_DBOS_URL": self.url,
            "BENCH_DBOS_SCHEMA": self.schema,
            "BENCH_DBOS_CONCURRENCY": str(self.concurrency),
            "BENCH_DBOS_POLL": str(self.poll),
            "BENCH_READY_DIR": str(self.folder / "dbos-ready"),
        }

    def start(self) -> DbosPeer:
        ready = self.folder / "dbos-ready"
        ready.mkdir(exist_ok=True)
        before = set(ready.glob("ready-*"))
        log = (self.folder / f"dbos-{time.time_ns()}.log").open("wb")
        with spawn_elsewhere(), log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.dbos_app"],
                cwd=ROOT,
                env={**os.environ, **self.env()},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = self.process
        wait_for(
            lambda: set(ready.glob("ready-*")) - before or process.poll() is not None,
            timeout=90,
            what="the DBOS worker to be ready",
        )
        if process.poll() is not None:
            raise RuntimeError(f"the DBOS worker exited at start (log in {self.folder})")
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=10)

    @property
    def client(self) -> Any:
        if self._client is None:
            from dbos import DBOSClient

            self._client = DBOSClient(system_database_url=self.url, dbos_system_schema=self.schema)
        return self._client

    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = create_engine(
                self.url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool
            )
        return self._engine

    def enqueue(self, workflow_id: str) -> Any:
        from bench.dbos_app import QUEUE, WORKFLOW

        return self.client.enqueue(
            {"queue_name": QUEUE, "workflow_name": WORKFLOW, "workflow_id": workflow_id}
        )

    def succeeded(self, prefix: str) -> int:
        query = text(
            f'SELECT count(*) FROM "{self.schema}".workflow_status '  # the schema is our own name
            "WHERE workflow_uuid LIKE :prefix AND status = 'SUCCESS'"
        )
        with self.engine().connect() as conn:
            return int(conn.execute(query, {"prefix": f"{prefix}%"}).scalar_one())

    def batch(self, n: int) -> None:
        """Enqueue `n` workflows one by one, then wait until every one of them succeeded."""
        prefix = f"b{uuid.uuid4().hex[:10]}-"
        for i in range(n):
            self.enqueue(f"{prefix}{i}")
        wait_for(
            lambda: self.succeeded(prefix) >= n,
            timeout=300,
            what=f"{n} DBOS workflows",
            interval=0.01,
        )

    def sample(self) -> float:
        t0 = time.perf_counter()
        handle = self.enqueue(f"l{uuid.uuid4().hex}")
        result = handle.get_result(polling_interval_sec=self.poll)
        elapsed = time.perf_counter() - t0
        assert result == "ok", result
        return elapsed

    def close(self) -> None:
        self.stop()
        if self._client is not None:
            self._client.destroy()
        engine = self.engine()
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '20s'"))
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
        engine.dispose()


def run_dbos(peer: DbosPeer, server: redis.Redis, calls: int, *, warmup: int) -> Run:
    peer.start()
    try:
        peer.batch(warmup)
        with cpu_meter(server, peer) as cpu:  # type: ignore[arg-type]  # has .process
            t0 = time.perf_counter()
            peer.batch(calls)
            seconds = time.perf_counter() - t0
    finally:
        peer.stop()
    return Run("dbos", calls, seconds, {}, redis_cpu=cpu["redis"], cpu=cpu["cpu"])


@dataclass
class Latency:
    dex: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)
    dbos: list[float] = field(default_factory=list)


def measure_latency(
    setup: Setup, peer: DbosPeer | None, samples: int, warmup: int, pause: float
) -> Latency:
    plain_env = {**setup.plain_env(backend=True), "BENCH_QUEUE": "plain"}
    os.environ.update(plain_env)
    import bench.plain_app as plain_app

    plain_app = importlib.reload(plain_app)  # with the result backend, on its own queue
    dx = _dex(setup)
    workers = [
        start_worker(BenchWorker("bench.dex_app", setup.dex_env(), setup.folder)),
        start_worker(
            BenchWorker("bench.plain_app", plain_env, setup.folder, extra_args=("-Q", "plain"))
        ),
    ]
    session = f"lat{uuid.uuid4().hex[:8]}"
    out = Latency()
    try:
        if peer is not None:
            peer.start()
        for i in range(warmup + samples):
            time.sleep(pause)
            d, _cpu = dex_wait_sample(dx, i, session)
            time.sleep(pause)
            t0 = time.perf_counter()
            plain_app.noop.delay().get(timeout=30)
            p = time.perf_counter() - t0
            if peer is not None:
                time.sleep(pause)
                b = peer.sample()
            if i >= warmup:
                out.dex.append(d)
                out.plain.append(p)
                if peer is not None:
                    out.dbos.append(b)
    finally:
        for w in workers:
            w.stop(warm=True)
        if peer is not None:
            peer.stop()
    return out


@contextlib.contextmanager
def dex_database() -> Iterator[str]:
    from devtools.pg_schema import postgres_schema

    with postgres_schema() as url:
        yield url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--batch", type=int, default=50, help="dex calls per request_calls")
    parser.add_argument("--samples", type=int, default=200, help="latency samples of each")
    parser.add_argument("--pause", type=float, default=0.02, help="idle s before each sample")
    parser.add_argument("--concurrency", type=int, default=2, help="Celery prefork processes")
    parser.add_argument("--dbos-concurrency", type=int, default=8, help="DBOS worker threads")
    parser.add_argument("--dbos-poll", type=float, default=0.01, help="DBOS polling interval s")
    parser.add_argument(
        "--task-events", action="store_true", help="Celery task events on, both Celery sides"
    )
    args = parser.parse_args(argv)
    header("peers: dex-celery, plain Celery and DBOS on the same PostgreSQL")
    has_dbos = dbos_available()
    if not has_dbos:
        print(SKIP_MESSAGE)
    folder = workdir("peers")
    (folder / "sql").mkdir()
    with spawn_elsewhere():
        server = RedisServer(folder / "redis").start()
    try:
        with dex_database() as url:
            setup = Setup(
                folder, server, url, args.concurrency, args.batch, task_events=args.task_events
            )
            peer = (
                DbosPeer(folder, _plain_url(url), args.dbos_concurrency, args.dbos_poll)
                if has_dbos
                else None
            )
            try:
                redis_client = redis.Redis.from_url(server.url)
                variants: list[tuple[str, Callable[[], Run]]] = [
                    ("A", lambda: run_plain(setup, args.calls, backend=False, warmup=args.warmup)),
                    ("dex", lambda: run_dex(setup, args.calls, warmup=args.warmup)),
                ]
                if peer is not None:
                    dbos_peer = peer
                    variants.append(
                        (
                            "dbos",
                            lambda: run_dbos(
                                dbos_peer, redis_client, args.calls, warmup=args.warmup
                            ),
                        )
                    )
                for r in range(args.rounds):
                    for _name, fn in variants:
                        run = fn()
                        setup.runs.append(run)
                        print(f"round {r + 1} {run.variant:>4}: {run.rate:8.1f} calls/s")
                latency = measure_latency(setup, peer, args.samples, 10, args.pause)
            finally:
                if peer is not None:
                    peer.close()
            report(setup, latency, args, has_dbos)
    finally:
        server.kill()
    return 0


def report(setup: Setup, latency: Latency, args: argparse.Namespace, has_dbos: bool) -> None:
    names = ("A", "dex", "dbos") if has_dbos else ("A", "dex")
    rates = {v: [r.rate for r in setup.runs if r.variant == v] for v in names}
    print()
    print(
        f"PostgreSQL, {args.calls} calls x {args.rounds} rounds; Celery prefork -c "
        f"{args.concurrency}, task events {'on' if args.task_events else 'off'}; DBOS "
        f"worker concurrency {args.dbos_concurrency}, polling {args.dbos_poll * 1000:.0f} ms"
    )
    labels = {
        "A": "plain Celery, no result backend",
        "dex": "dex-celery read no-op, terminal record in PostgreSQL",
        "dbos": "DBOS durable queue, one no-op step, SUCCESS in PostgreSQL",
    }
    for v in names:
        runs = [r for r in setup.runs if r.variant == v]
        n = sum(r.calls for r in runs)
        cpu = sum(sum(r.cpu) + r.redis_cpu for r in runs) / n * 1e6
        print(
            f"median {v:>4}: {median(rates[v]):8.1f} calls/s  ({labels[v]}; "
            f"cpu {cpu:5.0f} us/call without PostgreSQL's)"
        )

    def ratio(a: str, b: str) -> str:
        per = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        return f"median of rounds {median(per):.2f} (per round {' '.join(f'{x:.2f}' for x in per)})"

    print(f"ratio dex/A:    {ratio('dex', 'A')}")
    if has_dbos:
        print(f"ratio dex/dbos: {ratio('dex', 'dbos')}")
    print(f"latency: {args.samples} samples each, {args.pause * 1000:.0f} ms idle before each")
    series = [("dex  ", latency.dex), ("plain", latency.plain)]
    if has_dbos:
        series.append(("dbos ", latency.dbos))
    for name, values in series:
        print(
            f"{name}: p50 {percentile(values, 50) * 1e3:7.2f} ms  p99 "
            f"{percentile(values, 99) * 1e3:7.2f} ms  max {max(values) * 1e3:7.2f} ms"
        )
    for other, values in series[1:]:
        print(
            f"latency dex/{other.strip()}: p50 "
            f"{percentile(latency.dex, 50) / percentile(values, 50):.2f}  p99 "
            f"{percentile(latency.dex, 99) / percentile(values, 99):.2f}"
        )
    if not has_dbos:
        print(SKIP_MESSAGE)


if __name__ == "__main__":
    raise SystemExit(main())
