"""Redis CPU per call with the ledger on a Redis Cluster, per primary, beside plain Celery.

One run, interleaved round by round:

- A    plain Celery on the broker's redis-server (no result backend; the task INCRs a counter);
- dex  a `read` no-op tool with the ledger on a local Redis Cluster (three primaries with one
       replica each, `--shards` shards) and the broker on the same single redis-server as A.

For each timed part, `INFO cpu` (used_cpu_sys + used_cpu_user) of the broker and of every cluster
node before and after, divided by the calls: microseconds of Redis CPU per call, per primary
(and the replicas, which apply the primaries' writes). Same worker command for both
(`celery worker -P prefork -c 2`). A cluster node spends CPU while idle too (cluster bus,
replication pings, its cron); that idle rate, measured over `--idle` seconds before the runs,
is also reported subtracted ("net"), which matters when calls/s is low (a loaded machine).

    .venv/bin/python -m bench.cluster_cpu --calls 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import redis

from bench.common import (
    BenchWorker,
    RedisServer,
    header,
    median,
    redis_cpu,
    start_worker,
    workdir,
)
from bench.throughput import Setup, _dex_batch, run_plain
from devtools.redis_cluster import RedisClusterNodes


def run_dex(
    setup: Setup, cluster: RedisClusterNodes, shards: int, calls: int, warmup: int
) -> dict[str, Any]:
    from bench.dex_app import build
    from dex_celery import Settings

    env = {
        "DEX_REDIS_URL": cluster.url,
        "DEX_BROKER_URL": setup.url,
        "DEX_LEDGER_SHARDS": str(shards),
        "DEX_DATABASE_URL": setup.database_url,
        "DEX_KEY_PREFIX": "bench",
        "BENCH_SQL_COUNT_DIR": str(setup.folder / "sql"),
        "DEX_TASK_EVENTS": "0",
    }
    os.environ.update(env)
    _app, dx = build(Settings.from_env(env), "bench_client")
    dx.store.create_schema()
    worker = start_worker(BenchWorker("bench.dex_app", env, setup.folder, setup.concurrency))
    broker = redis.Redis.from_url(setup.url)
    try:
        _dex_batch(dx, warmup, setup.batch)
        nodes0, broker0 = cluster.cpu(), redis_cpu(broker)
        t0 = time.perf_counter()
        _dex_batch(dx, calls, setup.batch)
        seconds = time.perf_counter() - t0
        nodes1, broker1 = cluster.cpu(), redis_cpu(broker)
    finally:
        worker.stop(warm=True)
    roles = cluster.roles()
    held: dict[int, list[int]] = {}
    for shard in dx.keys.all_shards:
        held.setdefault(cluster.primary_of(shard.epoch).port, []).append(shard.index)
    return {
        "rate": calls / seconds,
        "seconds": seconds,
        "broker_us": (broker1 - broker0) / calls * 1e6,
        "nodes_us": {p: (nodes1[p] - nodes0[p]) / calls * 1e6 for p in nodes1},
        "roles": roles,
        "held": held,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle baseline")
    args = parser.parse_args(argv)
    header("Redis CPU per call, the ledger on a Redis Cluster (per primary), vs plain Celery")
    folder = workdir("cluster-cpu")
    (folder / "sql").mkdir()
    server = RedisServer(folder / "broker").start()
    cluster = RedisClusterNodes(folder / "cluster").start()
    setup = Setup(folder, server, f"sqlite:///{folder / 'dex.db'}", args.concurrency, args.batch)
    idle0 = cluster.cpu()
    time.sleep(args.idle)
    idle1 = cluster.cpu()
    idle_rate = {p: (idle1[p] - idle0[p]) / args.idle for p in idle1}
    plain_us: list[float] = []
    dex_runs: list[dict[str, Any]] = []
    try:
        for _ in range(args.rounds):
            a = run_plain(setup, args.calls, backend=False, warmup=args.warmup)
            plain_us.append(a.redis_cpu / a.calls * 1e6)
            dex_runs.append(run_dex(setup, cluster, args.shards, args.calls, args.warmup))
    finally:
        cluster.kill()
        server.kill()
    last = dex_runs[-1]
    print(f"calls {args.calls} x {args.rounds} rounds, shards {args.shards}, medians:")
    print(f"  plain Celery (A): Redis CPU {median(plain_us):.0f} us/call (one redis-server)")
    print(
        f"  dex: {median([r['rate'] for r in dex_runs]):.0f} calls/s; broker redis-server "
        f"{median([r['broker_us'] for r in dex_runs]):.0f} us/call"
    )
    total = net_total = 0.0
    for port, role in sorted(last["roles"].items(), key=lambda kv: (kv[1], kv[0])):
        us = median([r["nodes_us"].get(port, 0.0) for r in dex_runs])
        net = median(
            [
                r["nodes_us"].get(port, 0.0) - idle_rate[port] * r["seconds"] / args.calls * 1e6
                for r in dex_runs
            ]
        )
        total += us
        net_total += net
        shards = last["held"].get(port, [])
        print(
            f"  cluster node :{port} ({role}, shards {shards}): {us:.0f} us/call, "
            f"net of idle ({idle_rate[port] * 1e3:.1f} ms/s) {net:.0f} us/call"
        )
    print(f"  cluster, all nodes: {total:.0f} us/call, net of idle {net_total:.0f} us/call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
