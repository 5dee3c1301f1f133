"""Shared machinery of the benchmarks: a private redis-server, worker processes in their own
process group, readiness markers, statistics and a Markdown-friendly report line.

Never the shared Redis on port 6379: every benchmark starts its own server on a free port.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from celery import signals

from devtools.processes import CeleryWorker, RedisServer, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
#: Folder where a worker started by a benchmark drops `ready-<pid>` (see `announce_ready`).
READY_ENV = "BENCH_READY_DIR"

__all__ = [
    "ROOT",
    "BenchWorker",
    "CeleryWorker",
    "RedisServer",
    "commandstats",
    "free_port",
    "median",
    "percentile",
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
