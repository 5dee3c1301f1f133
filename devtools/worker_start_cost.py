"""CPU-seconds one test worker costs to start, with and without the test suite's fork server
(devtools/forkserver.py; docs/testing.md, "Where the time goes").

    PYTHONPATH=. .venv/bin/python -m devtools.worker_start_cost --starts 5

Starts a private redis-server and a SQLite database, then `--starts` prefork workers of the test
tools each way, one at a time; each worker's CPU (its main process and every process under it,
from /proc, read once it is ready) is summed before it is stopped. Linux only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from devtools import forkserver
from devtools.processes import RedisServer, Worker
from devtools.toolapp import LOG_ENV, make_app
from dex_celery.settings import Settings

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_of_tree(pid: int) -> float:
    """User + system seconds of `pid` and its descendants now (those still running)."""
    total = 0.0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS
        stack.extend(int(child) for child in children)
    return total


def _measure(env: dict[str, str], log_dir: Path, starts: int) -> list[float]:
    seconds = []
    for _ in range(starts):
        worker = Worker(env, log_dir, concurrency=2).start()
        seconds.append(_cpu_of_tree(worker.pid))
        worker.stop()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dex-worker-start-"))
    redis = RedisServer(folder / "redis").start()
    try:
        log_dir = folder / "log"
        log_dir.mkdir()
        env = {
            "DEX_REDIS_URL": redis.url,
            "DEX_DATABASE_URL": f"sqlite:///{folder / 'db.sqlite'}",
            "DEX_KEY_PREFIX": "start",
            LOG_ENV: str(log_dir),
        }
        os.environ.update(env)
        make_app(Settings.from_env(env))[1].store.create_schema()
        for label, enabled in (("new interpreter", "0"), ("fork server", "1")):
            os.environ[forkserver.ENABLE_ENV] = enabled
            seconds = _measure(env, log_dir, options.starts)
            print(
                f"{label}: {statistics.median(seconds):.2f} CPU-s per worker start "
                f"(median of {options.starts}; {min(seconds):.2f} to {max(seconds):.2f})"
            )
    finally:
        redis.kill()


if __name__ == "__main__":
    main()
