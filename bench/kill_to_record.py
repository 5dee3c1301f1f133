"""How long from a worker's SIGKILL to the terminal record, with the DEFAULT timing settings.

Starts its own redis-server and, per run, a real `celery worker -P prefork -c 2` on the test tool
app; requests one `slow_non_idempotent_write`, waits until the tool itself logged its start,
waits a random part of a heartbeat interval (so the kill lands anywhere between two lease
renewals), SIGKILLs the worker's whole process group (`Worker.kill_all`, a lost machine) and
measures the time until SQL holds the call's terminal record (`outcome_unknown`, S4.3). The
sweeper runs as `dex-celery sweep --loop` would: a loop in this process, every `sweep_interval`.

The bound: a lease lapses at most `heartbeat_timeout` after the kill (it was renewed at most
then), and the next sweep finds it within `sweep_interval`; the target leaves one more heartbeat
timeout of slack: `2 * heartbeat_timeout + sweep_interval` (12 s with the defaults).

    .venv/bin/python bench/kill_to_record.py -n 5
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devtools.processes import RedisServer, Worker, wait_for  # noqa: E402
from devtools.toolapp import LOG_ENV, executions, make_app  # noqa: E402
from dex_celery import CallStatus, Dex, Settings  # noqa: E402
from dex_celery.engine.upkeep.sweep import run_forever  # noqa: E402


def one_run(dex: Dex, env: dict[str, str], log_dir: Path, n: int) -> float:
    worker = Worker(env, log_dir, concurrency=2).start()
    try:
        record = dex.client().request_call(
            "bench", f"t{n}", "c1", "slow_non_idempotent_write", {"seconds": 300}
        )
        wait_for(
            lambda: any(line.startswith("start ") for line in executions(record.key)),
            timeout=60,
            what="the tool to start",
        )
        time.sleep(random.uniform(0, dex.settings.heartbeat_timeout / 3))  # the kill's phase
        killed_at = time.time()
        worker.kill_all()
        deadline = time.monotonic() + 120
        while True:
            current = dex.store.get_call(record.key)
            if current is not None and current.finished:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no terminal record for {record.key} after 120 s")
            time.sleep(0.02)
        if current.status is not CallStatus.OUTCOME_UNKNOWN:
            raise RuntimeError(f"expected outcome_unknown, got {current.status}: {current.error}")
        return (current.finished_at or time.time()) - killed_at
    finally:
        worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dex-kill-bench-") as tmp:
        base = Path(tmp)
        server = RedisServer(base / "redis").start()
        log_dir = base / "tool-log"
        log_dir.mkdir()
        env = {
            "DEX_REDIS_URL": server.url,
            "DEX_DATABASE_URL": f"sqlite:///{base / 'dex.db'}",
            "DEX_KEY_PREFIX": f"bench{uuid.uuid4().hex[:6]}",
            LOG_ENV: str(log_dir),
        }
        for name in list(os.environ):  # default timings: nothing inherited may override them
            if name.startswith("DEX_") and name not in env:
                del os.environ[name]
        os.environ.update(env)
        _app, dex = make_app(Settings.from_env(env))
        dex.store.create_schema()
        s = dex.settings
        target = 2 * s.heartbeat_timeout + s.sweep_interval
        print(
            f"heartbeat_timeout={s.heartbeat_timeout}s sweep_interval={s.sweep_interval}s "
            f"target <= {target:.1f}s"
        )
        stop = threading.Event()
        sweeper = threading.Thread(target=run_forever, args=(dex,), kwargs={"stop": stop})
        sweeper.start()
        times: list[float] = []
        try:
            for n in range(args.runs):
                elapsed = one_run(dex, env, log_dir, n)
                times.append(elapsed)
                print(f"run {n + 1}: kill -> terminal record {elapsed:.2f}s", flush=True)
        finally:
            stop.set()
            sweeper.join(timeout=10)
            server.kill()
        p50, worst = statistics.median(times), max(times)
        verdict = "OK" if worst <= target else "OVER TARGET"
        print(f"p50 {p50:.2f}s  max {worst:.2f}s  (target {target:.1f}s: {verdict})")
        return 0 if worst <= target else 1


if __name__ == "__main__":
    sys.exit(main())
