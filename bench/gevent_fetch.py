"""How a plain Celery `-P gevent` worker on the Redis transport fetches its messages: the queue
length, the unacknowledged count and the completions every `--every` seconds.

Written for section 17 of docs/benchmarks.md: in `bench.agent_shaped --pool gevent` plain
Celery ran at a sixth of the ideal rate. This run shows why: the worker takes `-c` messages,
finishes them, and then fetches nothing until its consumer's `drain_events(timeout=2.0)` times
out (Kombu pauses the `BRPOP` while the prefetch credit is used up, and nothing wakes the poll
when acknowledgements free it), so it works in bursts. Plain tasks `io.sleep` (`bench/io_apps.py`)
on a private redis-server; no dex-celery involved.

    .venv/bin/python -m bench.gevent_fetch --concurrency 200 --calls 2000 --seconds 0.265
"""

from __future__ import annotations

import argparse
import time

import redis
from celery import Celery

from bench.common import MAX_CONNECTIONS_ENV, BenchWorker, RedisServer, header, workdir
from bench.io_apps import COUNTER_KEY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=0.265, help="each task's wait")
    parser.add_argument("--every", type=float, default=0.5, help="sampling interval")
    parser.add_argument("--duration", type=float, default=8.0)
    args = parser.parse_args(argv)
    header("gevent_fetch: a plain Celery gevent worker's fetching, sampled")
    folder = workdir("gevent-fetch")
    server = RedisServer(folder / "redis").start()
    env = {
        "BENCH_SIDE": "plain",
        "BENCH_BROKER_URL": server.url,
        MAX_CONNECTIONS_ENV: str(2 * args.concurrency),
    }
    worker = BenchWorker(
        "bench.io_apps", env, folder, concurrency=args.concurrency, pool="gevent"
    ).start()
    client = redis.Redis.from_url(server.url)
    app = Celery("bench_gevent_fetch_client", broker=server.url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    try:
        with app.producer_or_acquire() as producer:
            for _ in range(args.calls):
                app.send_task("io.sleep", args=(args.seconds,), producer=producer)
        started = time.monotonic()
        print(f"{'t (s)':>6} {'done':>6} {'unacked':>8} {'queued':>7}")
        while time.monotonic() - started < args.duration:
            time.sleep(args.every)
            print(
                f"{time.monotonic() - started:6.1f} {int(client.get(COUNTER_KEY) or 0):6d} "
                f"{client.hlen('unacked'):8d} {client.llen('celery'):7d}"
            )
    finally:
        worker.stop(warm=False)
        server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
