"""Capacity: where the CPU of a call goes, per server, and calls/s with 1, 2 and 4 processes.

The ledger and the broker run on separate servers, so each one's cost per call is measured on
its own, beside plain Celery's in the same run:

- the ledger: a private redis-server (`DEX_REDIS_URL`): claims, finishes, events, the sweeper's
  indexes;
- the broker: a second private redis-server (`DEX_BROKER_URL`), or with `--rabbitmq` a vhost
  made for the run on the RabbitMQ at 127.0.0.1:5672 (deleted afterwards);
- plain Celery (no result backend; its task INCRs a counter on the broker Redis, or on the
  ledger's server under RabbitMQ, so completion is observable) publishes to the same broker.

Each round runs plain, then dex-celery (a `read` no-op, done when every call has its
`succeeded` record in SQL), with one worker of `-c N` prefork processes for N in `--workers`.
Reported per call: Redis CPU (`INFO cpu`, used_cpu_user + used_cpu_sys deltas) of each server,
RabbitMQ's CPU (its `beam.smp` process; shared with anything else using that RabbitMQ), the
worker's CPU (main process and pool), the driver's, SQL commits (client and workers) and, on
PostgreSQL, the CPU of the run's own backend processes (`application_name`). docs/scale.md turns
these into a capacity model.

    .venv/bin/python -m bench.capacity --calls 2000 --rounds 3 --workers 1,2,4
    .venv/bin/python -m bench.capacity --calls 2000 --rounds 3 --workers 1,2,4 --database postgres
    .venv/bin/python -m bench.capacity --calls 1000 --rounds 2 --workers 2 --rabbitmq
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, event, text
from sqlalchemy.pool import NullPool

from bench.common import (
    BenchWorker,
    CeleryWorker,
    RedisServer,
    header,
    median,
    process_cpu,
    redis_cpu,
    spawn_elsewhere,
    start_worker,
    workdir,
)
from bench.throughput import _dex_batch, _plain_batch

#: The RabbitMQ of these machines (docs/scale.md); a vhost of the run's own is made on it.
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672"
#: Marks the run's PostgreSQL connections, so their backends' CPU can be read.
PG_APPLICATION = "dex-capacity"


@dataclass
class Sample:
    """One timed run: `variant` (plain / dex) with `workers` pool processes."""

    variant: str
    workers: int
    calls: int
    seconds: float
    #: CPU seconds during the timed part, by part: ledger, broker, worker, driver, postgres.
    cpu: dict[str, float] = field(default_factory=dict)
    #: CPU seconds per second of each part with the worker up and no calls (`--idle`).
    idle: dict[str, float] = field(default_factory=dict)
    commits: float = 0.0

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    def us(self, part: str, *, net: bool = True) -> float:
        """CPU microseconds per call of `part` (NaN if not measured); with `net`, less what
        the part spends idle over the same time (timers, polling, heartbeats): on a loaded
        machine calls are slow, and the idle share would otherwise be charged to them."""
        if part not in self.cpu:
            return float("nan")
        spent = self.cpu[part]
        if net:
            spent = max(0.0, spent - self.idle.get(part, 0.0) * self.seconds)
        return spent / self.calls * 1e6


@dataclass
class Servers:
    """Where the run's parts live, and how to read each one's CPU."""

    ledger: RedisServer
    broker_url: str
    #: Plain Celery's broker: on RabbitMQ a vhost of its own (its classic `celery` queue and
    #: dex-celery's quorum one cannot share a name in one vhost); on Redis the same server.
    plain_broker_url: str
    broker_redis: RedisServer | None
    counter_url: str
    database_url: str
    folder: Path

    def meters(self) -> dict[str, Any]:
        """part -> a function returning that part's CPU seconds so far."""
        out: dict[str, Any] = {"ledger": _redis_meter(self.ledger.url)}
        if self.broker_redis is not None:
            out["broker"] = _redis_meter(self.broker_redis.url)
        else:
            beam = _beam_pid()
            if beam is not None:
                out["broker"] = lambda: _pid_cpu(beam)
        if self.database_url.startswith("postgresql"):
            out["postgres"] = _postgres_meter(self.database_url)
        return out


def _redis_meter(url: str) -> Any:
    client = redis.Redis.from_url(url)
    return lambda: redis_cpu(client)


def _pid_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _beam_pid() -> int | None:
    """The RabbitMQ server process (Erlang's `beam.smp`), if it runs on this machine."""
    out = subprocess.run(["pgrep", "-o", "beam.smp"], capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.stdout.split() else None


def _postgres_meter(url: str) -> Any:
    """CPU seconds of the PostgreSQL backends serving this run's connections (the server runs on
    this machine). Backends come and go with connection pools: a backend seen once counts with
    its last reading."""
    meter = {"application_name": f"{PG_APPLICATION}-meter"}  # not one of the run's own
    engine = create_engine(url, poolclass=NullPool, connect_args=meter)
    seen: dict[int, float] = {}

    def read() -> float:
        with engine.connect() as conn:
            pids = conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"),
                {"a": PG_APPLICATION},
            ).scalars()
            for pid in pids:
                with contextlib.suppress(OSError):
                    seen[int(pid)] = _pid_cpu(int(pid))
        return sum(seen.values())

    return read


def idle_rates(meters: dict[str, Any], worker: CeleryWorker, seconds: float) -> dict[str, float]:
    """CPU seconds per second of each part while no call runs (the worker up and waiting)."""
    if seconds <= 0:
        return {}
    with measured(meters, worker) as cpu:
        time.sleep(seconds)  # the measurement itself: nothing runs on purpose
    return {part: spent / seconds for part, spent in cpu.items() if part != "driver"}


@contextlib.contextmanager
def measured(meters: dict[str, Any], worker: CeleryWorker) -> Iterator[dict[str, float]]:
    """CPU seconds each part spends inside the block."""
    assert worker.process is not None
    pid = worker.process.pid
    before = {part: read() for part, read in meters.items()}
    driver0, worker0 = time.process_time(), sum(process_cpu(pid))
    out: dict[str, float] = {}
    yield out
    out["worker"] = sum(process_cpu(pid)) - worker0
    out["driver"] = time.process_time() - driver0
    for part, read in meters.items():
        out[part] = read() - before[part]


def run_plain(
    servers: Servers, workers: int, calls: int, warmup: int, events: bool, idle: float
) -> Sample:
    env = {
        "BENCH_BROKER_URL": servers.plain_broker_url,
        "BENCH_COUNTER_URL": servers.counter_url,
        "BENCH_RESULT_BACKEND": "",
        "BENCH_ACKS_LATE": "1",
        "BENCH_TASK_EVENTS": "1" if events else "0",
    }
    os.environ.update(env)
    import bench.plain_app as plain

    plain = importlib.reload(plain)  # re-read the broker and counter settings
    worker = start_worker(BenchWorker("bench.plain_app", env, servers.folder, concurrency=workers))
    counter = redis.Redis.from_url(servers.counter_url)
    meters = servers.meters()
    meters.pop("postgres", None)
    if servers.broker_redis is not None:
        meters.pop("ledger", None)  # the counter lives with the broker: plain Celery's only Redis
    try:
        _plain_batch(plain, counter, warmup, False)
        rest = idle_rates(meters, worker, idle)
        with measured(meters, worker) as cpu:
            t0 = time.perf_counter()
            _plain_batch(plain, counter, calls, False)
            seconds = time.perf_counter() - t0
    finally:
        worker.stop(warm=True)
    return Sample("plain", workers, calls, seconds, cpu, rest)


_dexes: dict[str, Any] = {}


def _client_dex(servers: Servers, events: bool) -> Any:
    if "dex" not in _dexes:
        from bench.dex_app import build
        from dex_celery import Settings

        settings = Settings(
            redis_url=servers.ledger.url,
            broker_url=servers.broker_url,
            database_url=servers.database_url,
            key_prefix="bench",
            task_events=events,
        )
        _app, dx = build(settings, "bench_client")
        dx.store.create_schema()
        _dexes["dex"] = dx
    return _dexes["dex"]


def run_dex(
    servers: Servers, workers: int, calls: int, warmup: int, events: bool, batch: int, idle: float
) -> Sample:
    dx = _client_dex(servers, events)
    sql = servers.folder / f"sql-{uuid.uuid4().hex[:8]}"
    sql.mkdir()
    env = {
        "DEX_REDIS_URL": servers.ledger.url,
        "DEX_BROKER_URL": servers.broker_url,
        "DEX_DATABASE_URL": servers.database_url,
        "DEX_KEY_PREFIX": "bench",
        "DEX_TASK_EVENTS": "1" if events else "0",
        "BENCH_SQL_COUNT_DIR": str(sql),
    }
    worker = start_worker(BenchWorker("bench.dex_app", env, servers.folder, concurrency=workers))
    commits = {"n": 0}

    def count(_conn: Any) -> None:
        commits["n"] += 1

    try:
        _dex_batch(dx, warmup, batch)
        meters = servers.meters()
        rest = idle_rates(meters, worker, idle)
        event.listen(dx.store.engine, "commit", count)
        with measured(meters, worker) as cpu:
            t0 = time.perf_counter()
            _dex_batch(dx, calls, batch)
            seconds = time.perf_counter() - t0
        event.remove(dx.store.engine, "commit", count)
    finally:
        worker.stop(warm=True)
    # Workers write their commit counts at shutdown; the warm-up's are in them too.
    worker_commits = sum(int(p.read_text()) for p in sql.glob("commits-*"))
    sample = Sample("dex", workers, calls, seconds, cpu, rest)
    sample.commits = commits["n"] / calls + worker_commits / (calls + warmup)
    return sample


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """A vhost of the run's own on the local RabbitMQ (`rabbitmqctl`), deleted afterwards."""
    if shutil.which("rabbitmqctl") is None:
        raise SystemExit("--rabbitmq: rabbitmqctl is not installed here")
    vhost = f"dex-capacity-{uuid.uuid4().hex[:8]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, timeout=60)
    try:
        subprocess.run(
            ["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
            check=True,
            timeout=60,
        )
        yield f"{RABBITMQ}/{vhost}"
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], timeout=60, check=False)


@contextlib.contextmanager
def database(kind: str, folder: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'dex.db'}"
        return
    from devtools.pg_schema import postgres_schema

    with postgres_schema() as url:
        yield f"{url}&application_name={PG_APPLICATION}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--batch", type=int, default=50, help="calls per request_calls (one turn)")
    parser.add_argument("--workers", default="1,2,4", help="prefork processes per run (-c)")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rabbitmq", action="store_true", help="the broker on RabbitMQ")
    parser.add_argument(
        "--idle",
        type=float,
        default=2.0,
        help="seconds of idle CPU measured per run, subtracted from the calls' share (0: none)",
    )
    parser.add_argument(
        "--task-events", action="store_true", help="Celery task events on, both sides"
    )
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    header("capacity: CPU per call by server, calls/s by worker processes")
    folder = workdir("capacity")
    with contextlib.ExitStack() as stack:
        with spawn_elsewhere():
            ledger = RedisServer(folder / "ledger").start()
            stack.callback(ledger.kill)
            broker_redis = None
            if not args.rabbitmq:
                broker_redis = RedisServer(folder / "broker").start()
                stack.callback(broker_redis.kill)
        if broker_redis is not None:
            broker_url = plain_broker_url = broker_redis.url
        else:
            broker_url = stack.enter_context(rabbitmq_vhost())
            plain_broker_url = stack.enter_context(rabbitmq_vhost())
        url = stack.enter_context(database(args.database, folder))
        servers = Servers(
            ledger,
            broker_url,
            plain_broker_url,
            broker_redis,
            broker_redis.url if broker_redis is not None else ledger.url,
            url,
            folder,
        )
        samples: list[Sample] = []
        for r in range(args.rounds):
            for n in counts:
                plain = run_plain(servers, n, args.calls, args.warmup, args.task_events, args.idle)
                dex = run_dex(
                    servers, n, args.calls, args.warmup, args.task_events, args.batch, args.idle
                )
                samples += [plain, dex]
                print(
                    f"round {r + 1} -c {n}: plain {plain.rate:7.1f} calls/s, "
                    f"dex {dex.rate:7.1f} calls/s"
                )
        report(samples, counts, args)
    return 0


def report(samples: list[Sample], counts: list[int], args: argparse.Namespace) -> None:
    broker = "RabbitMQ (beam.smp CPU, shared)" if args.rabbitmq else "a second redis-server"
    print()
    print(
        f"database {args.database}, broker {broker}, {args.calls} calls x {args.rounds} rounds, "
        f"batch {args.batch}, task events {'on' if args.task_events else 'off'} (both sides)"
    )
    print(
        f"medians over rounds; CPU in microseconds per call, less each part's idle CPU over the "
        f"same time (measured {args.idle:g} s per run with the worker up and no calls)"
    )
    print(
        f"{'-c':>3} {'plain/s':>8} {'dex/s':>8} {'ratio':>6} | {'plain broker':>12} | "
        f"{'dex ledger':>10} {'dex broker':>10} {'dex worker':>10} {'dex driver':>10} "
        f"{'pg':>6} {'commits':>7}"
    )
    for n in counts:
        plain = [s for s in samples if s.variant == "plain" and s.workers == n]
        dex = [s for s in samples if s.variant == "dex" and s.workers == n]
        rates = [d.rate / p.rate for p, d in zip(plain, dex, strict=True)]

        def med(runs: list[Sample], part: str) -> float:
            return median([s.us(part) for s in runs])

        print(
            f"{n:>3} {median([s.rate for s in plain]):8.1f} {median([s.rate for s in dex]):8.1f} "
            f"{median(rates):6.2f} | {med(plain, 'broker'):12.0f} | {med(dex, 'ledger'):10.0f} "
            f"{med(dex, 'broker'):10.0f} {med(dex, 'worker'):10.0f} {med(dex, 'driver'):10.0f} "
            f"{med(dex, 'postgres'):6.0f} {median([s.commits for s in dex]):7.3f}"
        )
    plain_all = [s for s in samples if s.variant == "plain"]
    dex_all = [s for s in samples if s.variant == "dex"]
    ledger_us = median([s.us("ledger") for s in dex_all])
    broker_us = median([s.us("broker") for s in dex_all])
    plain_us = median([s.us("broker") for s in plain_all])
    worker_us = median([s.us("worker") for s in dex_all])
    plain_worker_us = median([s.us("worker") for s in plain_all])
    print(
        f"redis cpu/call (median of all runs): dex ledger {ledger_us:.0f} us + dex broker "
        f"{broker_us:.0f} us; plain celery broker {plain_us:.0f} us"
    )
    print(
        f"worker cpu/call (median of all runs): dex {worker_us:.0f} us; plain celery "
        f"{plain_worker_us:.0f} us"
    )
    raw = {
        part: median([s.us(part, net=False) for s in runs])
        for part, runs in (("ledger", dex_all), ("broker", dex_all))
    }
    idle = {
        part: median([s.idle.get(part, float("nan")) * 1e3 for s in dex_all])
        for part in ("ledger", "broker", "worker")
    }
    print(
        f"without the idle subtraction: dex ledger {raw['ledger']:.0f} us, dex broker "
        f"{raw['broker']:.0f} us, plain celery broker "
        f"{median([s.us('broker', net=False) for s in plain_all]):.0f} us; idle CPU of the dex "
        f"run, ms per second: ledger {idle['ledger']:.1f}, broker {idle['broker']:.1f}, "
        f"worker {idle['worker']:.1f}"
    )
    print(
        f"calls/s per core, from these: ledger server {_per_core(ledger_us)}, broker server "
        f"{_per_core(broker_us)} (plain celery's {_per_core(plain_us)}), dex worker processes "
        f"{_per_core(worker_us)}"
    )


def _per_core(us: float) -> str:
    """Calls/s one core serves at `us` microseconds per call ('n/a' if not measurable: below
    the idle noise of a server shared with others, such as RabbitMQ here)."""
    return f"{1e6 / us:.0f}" if us > 0 else "n/a"


if __name__ == "__main__":
    raise SystemExit(main())
