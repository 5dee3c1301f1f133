"""CPU per call of every process, dex-celery against plain Celery, and the Redis commands each
process sends per call.

The throughput bench's two sides (`bench/throughput.py`: plain Celery A, no result backend, and
dex-celery's `read` no-op with its record in SQL), task events on both, one private
redis-server, a `prefork -c 2` worker each, rounds interleaved (plain, dex, plain, dex...). For
each timed run: the CPU (user + system, `/proc/<pid>/stat`) of the requester (this driver: it
publishes, or requests, and waits for the completions), the worker's main process, its pool
processes, its outcome recorder (dex-celery only), and redis-server (`INFO cpu`), per call.
After the timed part of each run, an untimed batch under `MONITOR` (`bench/round_trips.py`)
counts the commands each process sent per call (round trips; a pipeline's commands count one
each; commands a script runs inside Redis do not count).

    .venv/bin/python -m bench.cpu_budget --calls 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench import round_trips
from bench.common import RedisServer, header, median, redis_cpu, spawn_elsewhere, workdir
from bench.throughput import Setup, _dex, _dex_batch, _plain_batch, _worker, database

REQUESTER, REDIS = "requester", "redis-server"
ROLES = (REQUESTER, round_trips.MAIN, round_trips.POOL, round_trips.RECORDER, REDIS)


@dataclass
class Measured:
    side: str
    calls: int
    seconds: float
    #: CPU seconds per role over the timed part.
    cpu: dict[str, float]
    #: Commands sent per role over the monitored batch, and that batch's size.
    sent: dict[str, Counter[str]] = field(default_factory=dict)
    monitored_calls: int = 0


def _cpu(pid: int) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / tick


def _snapshot(pids: dict[int, str], server: redis.Redis) -> dict[str, float]:
    out = dict.fromkeys(ROLES, 0.0)
    for pid, role in pids.items():
        out[role] += _cpu(pid)
    out[REQUESTER] = time.process_time()
    out[REDIS] = redis_cpu(server)
    return out


def measure(setup: Setup, side: str, calls: int, warmup: int, monitor_calls: int) -> Measured:
    if side == "plain":
        import importlib

        os.environ.update(setup.plain_env(False))
        import bench.plain_app as plain

        plain = importlib.reload(plain)
        worker = _worker(setup, "bench.plain_app", setup.plain_env(False))
        client = redis.Redis.from_url(setup.url)

        def batch(n: int) -> None:
            _plain_batch(plain, client, n, False)

    else:
        dx = _dex(setup)
        worker = _worker(setup, "bench.dex_app", setup.dex_env())
        client = redis.Redis.from_url(setup.url)

        def batch(n: int) -> None:
            _dex_batch(dx, n, setup.batch)

    assert worker.process is not None
    try:
        batch(warmup)
        pids = round_trips.roles(worker.process.pid)
        before = _snapshot(pids, client)
        t0 = time.perf_counter()
        batch(calls)
        seconds = time.perf_counter() - t0
        after = _snapshot(pids, client)
        cpu = {role: after[role] - before[role] for role in ROLES}
        with round_trips.monitored(setup.url) as sent:
            batch(monitor_calls)
            ports = round_trips.owners({**pids, os.getpid(): REQUESTER})
        counted = round_trips.by_role(sent, ports)
    finally:
        worker.stop(warm=True)
    return Measured(side, calls, seconds, cpu, counted, monitor_calls)


def _us(runs: list[Measured], role: str) -> float:
    return sum(r.cpu[role] for r in runs) / sum(r.calls for r in runs) * 1e6


def _per_call(runs: list[Measured], role: str) -> tuple[float, str]:
    total: Counter[str] = Counter()
    for r in runs:
        total.update(r.sent.get(role, Counter()))
    n = sum(r.monitored_calls for r in runs)
    top = ", ".join(f"{k} {v / n:.2f}" for k, v in total.most_common(4))
    return sum(total.values()) / n, top


def report(runs: list[Measured]) -> None:
    sides = {s: [r for r in runs if r.side == s] for s in ("plain", "dex")}
    rates = {s: [r.calls / r.seconds for r in rs] for s, rs in sides.items()}
    ratios = [d / p for p, d in zip(rates["plain"], rates["dex"], strict=True)]
    print()
    print(
        f"calls/s: plain {median(rates['plain']):.1f}, dex {median(rates['dex']):.1f}; "
        f"ratio dex/plain median {median(ratios):.2f} (per round "
        + " ".join(f"{x:.2f}" for x in ratios)
        + ")"
    )
    print()
    print(
        "| process | plain Celery us/call | dex-celery us/call | dex - plain | "
        "commands sent/call plain | dex |"
    )
    print("|---|---|---|---|---|---|")
    totals = {"plain": 0.0, "dex": 0.0}
    for role in ROLES:
        p, d = _us(sides["plain"], role), _us(sides["dex"], role)
        totals["plain"] += p
        totals["dex"] += d
        if role == REDIS:
            cp = cd = "-"
        else:
            np_, tp = _per_call(sides["plain"], role)
            nd, td = _per_call(sides["dex"], role)
            cp, cd = f"{np_:.2f} ({tp})", f"{nd:.2f} ({td})"
        print(f"| {role} | {p:,.0f} | {d:,.0f} | {d - p:+,.0f} | {cp} | {cd} |")
    p, d = totals["plain"], totals["dex"]
    print(f"| total | {p:,.0f} | {d:,.0f} | {d - p:+,.0f} | | |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--monitor-calls", type=int, default=200)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args(argv)
    header("cpu budget per process: dex-celery vs plain Celery (task events on both)")
    folder = workdir("cpu-budget")
    (folder / "sql").mkdir()
    with spawn_elsewhere():
        server = RedisServer(folder / "redis").start()
    runs: list[Measured] = []
    try:
        with database(args.database, folder) as url:
            setup = Setup(folder, server, url, 2, args.batch, task_events=True)
            for r in range(args.rounds):
                for side in ("plain", "dex"):
                    m = measure(setup, side, args.calls, args.warmup, args.monitor_calls)
                    runs.append(m)
                    print(
                        f"round {r + 1} {m.side:>5}: {m.calls / m.seconds:8.1f} calls/s, "
                        f"load {os.getloadavg()[0]:.2f}"
                    )
            report(runs)
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
