"""Pruning history: `dex-celery history prune` over 1,000,000 old calls, and the calls running
beside it (docs/operations.md, "Retention").

History is written in bulk straight to SQL (`devtools/history_seed.py`: ended calls a few days
old, ten to a session, each with its TOOL message, one user message per session, counted in
`dex_call_counts`). A prefork worker (`-c 2`) runs `noop` calls requested by this driver in
batches of `--call-batch`; their throughput is measured for `--baseline` seconds without a
prune, then while the real `dex-celery -A bench.dex_app:dex history prune` subprocess removes
the whole history (archived), then for `--baseline` seconds again. Reported: the prune's time
and rate, the archive's size, calls/s and the slowest call batch without and beside the prune.

    .venv/bin/python -m bench.retention --history 1000000 --database sqlite,postgres
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import ROOT, BenchWorker, RedisServer, header, median, start_worker, workdir
from bench.throughput import database
from devtools.history_seed import seed_history
from dex_celery import Settings
from dex_celery.engine.request.dispatch import CallRequest


@dataclass(frozen=True)
class Drive:
    """Calls run during one phase."""

    calls: int
    seconds: float
    batch_seconds: list[float]

    @property
    def rate(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def line(self, name: str) -> str:
        slowest = max(self.batch_seconds) if self.batch_seconds else float("nan")
        return (
            f"  {name:<16} {self.rate:7.1f} calls/s  ({self.calls} calls in {self.seconds:.1f}s; "
            f"batch median {median(self.batch_seconds) * 1e3:.0f} ms, slowest {slowest * 1e3:.0f} ms)"
        )


class Driver:
    """Requests `noop` calls in batches and waits for each batch's records, until told to stop."""

    def __init__(self, dx: Any, batch: int) -> None:
        self.client = dx.client()
        self.batch = batch
        self.turn = 0

    def run(self, until: Callable[[], bool]) -> Drive:
        times: list[float] = []
        calls = 0
        started = time.perf_counter()
        while not until():
            self.turn += 1
            requests = [
                CallRequest(f"live-{self.turn // 50}", f"t{self.turn}", f"c{i}", "noop", {})
                for i in range(self.batch)
            ]
            t0 = time.perf_counter()
            records = self.client.request_calls(requests)
            done = self.client.wait([r.key for r in records], timeout=120)
            times.append(time.perf_counter() - t0)
            bad = [r.key for r in done if r.status.value != "succeeded"]
            if bad:
                raise AssertionError(f"calls beside the prune did not succeed: {bad[:5]}")
            calls += len(done)
        return Drive(calls, time.perf_counter() - started, times)


def for_seconds(seconds: float) -> Callable[[], bool]:
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


def one_database(kind: str, args: argparse.Namespace, folder: Path, redis_url: str) -> None:
    from bench.dex_app import build  # the app of the workers, built here for the driver too

    with database(kind, folder) as url:
        env = {
            "DEX_REDIS_URL": redis_url,
            "DEX_DATABASE_URL": url,
            "DEX_KEY_PREFIX": f"rt{uuid.uuid4().hex[:6]}",
        }
        _app, dx = build(Settings.from_env(env), "retention_bench")
        dx.store.create_schema()
        t0 = time.perf_counter()
        seed_history(
            dx.store.engine,
            count=args.history,
            requested_at=time.time() - 3 * 86400,
            progress=args.history >= 200_000,
        )
        print(f"{kind}: wrote {args.history:,} old calls in {time.perf_counter() - t0:.1f}s")
        worker = start_worker(BenchWorker("bench.dex_app", env, folder / kind, 2))
        try:
            driver = Driver(dx, args.call_batch)
            driver.run(for_seconds(args.warmup))
            before = driver.run(for_seconds(args.baseline))
            archive = folder / f"{kind}-history.jsonl.gz"
            command = [
                str(Path(sys.executable).parent / "dex-celery"),
                "-A",
                "bench.dex_app:dex",
                "history",
                "prune",
                "--before",
                "1d",
                "--archive",
                str(archive),
                "--batch",
                str(args.batch),
                "--json",
            ]
            t0 = time.perf_counter()
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            beside = driver.run(lambda: process.poll() is not None)
            out, _ = process.communicate()
            elapsed = time.perf_counter() - t0
            if process.returncode != 0:
                raise SystemExit(f"history prune exited {process.returncode}")
            report = json.loads(out)
            after = driver.run(for_seconds(args.baseline))
        finally:
            worker.stop()
        size = archive.stat().st_size if archive.exists() else 0
        print(
            f"{kind}: pruned {report['calls']:,} calls, {report['sessions']:,} sessions, "
            f"{report['messages']:,} messages in {elapsed:.1f}s "
            f"({report['calls'] / elapsed:,.0f} calls/s, batch {args.batch}); archive "
            f"{size / 1e6:.1f} MB ({size / max(report['calls'], 1):.0f} bytes/call)"
        )
        print(before.line("before the prune"))
        print(beside.line("beside the prune"))
        print(after.line("after the prune"))
        ratio = beside.rate / before.rate if before.rate else float("nan")
        print(f"  calls/s beside / before: {ratio:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=1_000_000, help="old calls to prune")
    parser.add_argument("--database", default="sqlite,postgres", help="sqlite, postgres or both")
    parser.add_argument("--batch", type=int, default=500, help="calls per prune transaction")
    parser.add_argument("--call-batch", type=int, default=20, help="calls per driver batch")
    parser.add_argument("--baseline", type=float, default=20.0, help="seconds without a prune")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of calls first")
    args = parser.parse_args(argv)
    header("pruning history beside running calls")
    folder = workdir("retention")
    server = RedisServer(folder / "redis").start()
    try:
        for kind in args.database.split(","):
            one_database(kind, args, folder, server.url)
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
