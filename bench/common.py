"""Shared machinery of the benchmarks: a private redis-server, worker processes in their own
process group, readiness markers, statistics and a Markdown-friendly report line.

Never the shared Redis on port 6379: every benchmark starts its own server on a free port.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from celery import signals

from devtools.processes import CeleryWorker, RedisServer, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
#: Folder where a worker started by a benchmark drops `ready-<pid>` (see `announce_ready`).
READY_ENV = "BENCH_READY_DIR"
#: Kombu's Redis connection pool size of a worker (`max_connections`, default 10), set by drivers
#: of `gevent` workers (see `broker_pool_from_env`).
MAX_CONNECTIONS_ENV = "BENCH_BROKER_MAX_CONNECTIONS"

__all__ = [
    "ROOT",
    "BenchWorker",
    "CeleryWorker",
    "RedisServer",
    "commandstats",
    "free_port",
    "median",
    "percentile",
    "pin_driver",
    "process_cpu",
    "redis_cpu",
    "spawn_elsewhere",
    "wait_for",
    "workdir",
]


def announce_ready() -> None:
    """Connect in a worker app module: write `ready-<pid>` once the worker consumes."""

    @signals.worker_ready.connect(weak=False)
    def _ready(sender: Any = None, **_: Any) -> None:
        folder = os.environ.get(READY_ENV)
        if folder:
            (Path(folder) / f"ready-{os.getpid()}").write_text(str(time.time()))


def broker_pool_from_env(app: Any) -> None:
    """Call in a worker app module: size Kombu's Redis pool from `BENCH_BROKER_MAX_CONNECTIONS`.

    On `-P gevent -c 200` the greenlets ack at once, and Kombu's default pool of 10 connections
    then fails acks with `MaxConnectionsError` (an early-acked message then never runs). Both
    sides of a run get the same value, as a deployment on gevent would configure it.
    """
    size = os.environ.get(MAX_CONNECTIONS_ENV)
    if size:
        app.conf.broker_transport_options = {
            **(app.conf.broker_transport_options or {}),
            "max_connections": int(size),
        }


#: The CPU the benchmark driver runs on when `pin_driver` was called (None: not pinned).
_driver_cpu: int | None = None


def pin_driver(cpu: int | None) -> None:
    """Run this process (the driver: publisher, client, completion polling) on CPU `cpu` only.

    The system under test (redis-server, the workers and their pool processes) is started inside
    `spawn_elsewhere`, so it inherits the other CPUs: the driver's own Python work then competes
    with neither side, and the ratio describes the systems rather than who shares a core with the
    driver. Linux only (`os.sched_setaffinity`); call it before any thread starts, since the
    affinity is per thread.
    """
    global _driver_cpu
    if cpu is None:
        return
    cpus = os.sched_getaffinity(0)
    if cpu not in cpus or len(cpus) < 2:
        raise SystemExit(f"--driver-cpu {cpu}: needs two CPUs, this process may use {sorted(cpus)}")
    os.sched_setaffinity(0, {cpu})
    _driver_cpu = cpu


@contextlib.contextmanager
def spawn_elsewhere() -> Iterator[None]:
    """Processes started inside inherit every CPU but the driver's (no-op when not pinned)."""
    cpu = _driver_cpu
    if cpu is None:
        yield
        return
    others = set(range(os.cpu_count() or 1)) - {cpu}
    os.sched_setaffinity(0, others)
    try:
        yield
    finally:
        os.sched_setaffinity(0, {cpu})


def workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"dex-bench-{prefix}-"))


def BenchWorker(
    module: str,
    env: Mapping[str, str],
    folder: Path,
    concurrency: int = 2,
    pool: str = "prefork",
    extra_args: Sequence[str] = (),
) -> CeleryWorker:
    """A worker of a benchmark app (`bench.*_app`); the app calls `announce_ready`."""
    return CeleryWorker(
        module,
        env,
        folder / "ready",
        concurrency,
        pool,
        loglevel="warning",
        extra_args=extra_args,
        ready_env=READY_ENV,
    )


def start_worker(worker: CeleryWorker) -> CeleryWorker:
    """Start `worker` off the driver's CPU (see `pin_driver`)."""
    with spawn_elsewhere():
        return worker.start()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def commandstats(client: Any) -> dict[str, int]:
    """`INFO commandstats` as {command: calls}."""
    info = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}


def redis_cpu(client: Any) -> float:
    """Seconds of CPU the redis-server process has used (user + system, `INFO cpu`)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def process_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process `pid` and of its live children (Linux `/proc`).

    For a Celery worker: (the main process: consumer, events, acks; its pool processes). Pool
    processes live for the whole run, so deltas over a timed part are theirs alone.
    """
    tick = os.sysconf("SC_CLK_TCK")

    def cpu(p: int) -> float:
        fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / tick

    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children.extend(int(c) for c in (task / "children").read_text().split())
    return cpu(pid), sum(cpu(c) for c in children)


def stats_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}


def header(title: str) -> None:
    load = os.getloadavg()
    print(f"# {title}")
    print(
        f"date {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}  "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}  cpus {os.cpu_count()}"
    )
    print("command: " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))
