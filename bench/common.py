"""Shared machinery of the benchmarks: a private redis-server, worker processes in their own
process group, readiness markers, statistics and a Markdown-friendly report line.

Never the shared Redis on port 6379: every benchmark starts its own server on a free port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import signals

from tests.support.processes import RedisServer, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
#: Folder where a worker started by a benchmark drops `ready-<pid>` (see `announce_ready`).
READY_ENV = "BENCH_READY_DIR"

__all__ = [
    "ROOT",
    "BenchWorker",
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


@dataclass
class BenchWorker:
    """`celery -A <module> worker -P <pool> -c <n>` in its own process group."""

    module: str
    env: Mapping[str, str]
    folder: Path
    concurrency: int = 2
    pool: str = "prefork"
    extra_args: Sequence[str] = ()
    process: subprocess.Popen[bytes] | None = None
    logfile: Path = field(default_factory=lambda: Path("/dev/null"))

    def start(self, *, timeout: float = 60) -> BenchWorker:
        ready = self.folder / "ready"
        ready.mkdir(parents=True, exist_ok=True)
        before = set(ready.iterdir())
        self.logfile = self.folder / f"worker-{time.time_ns()}.log"
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.module,
            "worker",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "-l",
            "warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"bench{time.time_ns()}@%h",
            *self.extra_args,
        ]
        with self.logfile.open("wb") as out:
            self.process = subprocess.Popen(
                args,
                cwd=ROOT,
                env={**os.environ, **self.env, READY_ENV: str(ready)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(
            lambda: set(ready.iterdir()) - before or self.died(),
            timeout=timeout,
            what=f"worker {self.module} to be ready",
        )
        if self.died():
            raise RuntimeError(f"worker exited at start:\n{self.logfile.read_text()[-3000:]}")
        return self

    def died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill_group(self) -> None:
        """SIGKILL the main process and its pool children at once, as a lost machine."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL of the group if it lingers."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.process = None


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
