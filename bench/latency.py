"""Latency: request-to-outcome of single no-op calls on an idle system, against plain Celery's
`delay().get()` with a Redis result backend.

dex-celery, four figures:
- `dex wait()`: `request_call` of the `read` no-op, then `DexClient.wait` until it returns the
  SQL record (the default: what follows agrees with SQL);
- `dex wait(recorded=False)`: the same, returning at the ledger's decision, before the worker's
  recorder writes it to SQL (`engine/decided_outcomes.py`);
- `dex (record in SQL)`: the same call, until its `tool_call_finished` event (written by the
  `recorded` script after the SQL record landed; the record is then read back to confirm);
- `requester cpu`: CPU seconds of this process inside `request_call` (the two `wait` samples)
  and inside plain's `delay()` (its result backend's subscription included), mean and median;
- `dex (ledger decided)`: in the same samples, until the `tool_call_ended` event (`finish.lua`:
  the ledger holds the outcome, before the recorder writes it): what a caller answered from the
  ledger alone could reach, the bound of taking SQL off the caller's wait.
Samples of all alternate one by one, each after a short idle pause, with both workers
(`prefork -c 2`) running, each on its own queue.

    .venv/bin/python -m bench.latency --samples 500
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any

import redis

from bench.common import (
    BenchWorker,
    RedisServer,
    header,
    percentile,
    pin_driver,
    spawn_elsewhere,
    start_worker,
    workdir,
)
from bench.throughput import Setup, _dex


def dex_sample(
    dx: Any, client: redis.Redis, events: str, n: int, session: str
) -> tuple[float, float]:
    """Seconds from the request to its `tool_call_ended` event (the ledger decided the
    outcome) and to its `tool_call_finished` event (the record is in SQL)."""
    last = client.xrevrange(events, count=1)
    position: Any = last[0][0] if last else "0-0"
    t0 = time.perf_counter()
    record = dx.client().request_call(session, f"t{n}", "c", "noop", {})
    decided = 0.0
    key = record.key.encode()
    while True:
        reply: Any = client.xread({events: position}, block=10_000, count=100)
        if not reply:
            raise TimeoutError(f"no finished event for {record.key}")
        for _stream, entries in reply:
            for entry_id, fields in entries:
                position = entry_id
                if fields.get(b"key") != key:
                    continue
                if fields.get(b"type") == b"tool_call_ended":
                    decided = time.perf_counter() - t0
                elif fields.get(b"type") == b"tool_call_finished":
                    elapsed = time.perf_counter() - t0
                    assert dx.store.get_call(record.key).status.value == "succeeded"
                    return decided or elapsed, elapsed


def dex_wait_sample(dx: Any, n: int, session: str, *, recorded: bool = True) -> tuple[float, float]:
    """Seconds from `request_call` until `DexClient.wait(..., recorded=recorded)` returns, and
    the CPU seconds this process spent in `request_call` (the requester's cost)."""
    client = dx.client()
    t0 = time.perf_counter()
    c0 = time.process_time()
    record = client.request_call(session, f"{'w' if recorded else 'l'}{n}", "c", "noop", {})
    cpu = time.process_time() - c0
    (done,) = client.wait([record.key], timeout=10, recorded=recorded)
    elapsed = time.perf_counter() - t0
    assert done.status.value == "succeeded", done
    return elapsed, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.02, help="idle seconds between samples")
    parser.add_argument(
        "--driver-cpu",
        type=int,
        default=None,
        help="run this driver on that CPU only, Redis and the workers on the others (taskset)",
    )
    args = parser.parse_args(argv)
    pin_driver(args.driver_cpu)
    header("latency: single call request-to-record, dex-celery vs plain delay().get()")
    folder = workdir("latency")
    (folder / "sql").mkdir()
    with spawn_elsewhere():
        server = RedisServer(folder / "redis").start()
    setup = Setup(folder, server, f"sqlite:///{folder / 'dex.db'}", 2, 1)
    plain_env = {**setup.plain_env(backend=True), "BENCH_QUEUE": "plain"}
    os.environ.update(plain_env)
    from bench import plain_app

    dx = _dex(setup)
    workers = [
        start_worker(BenchWorker("bench.dex_app", setup.dex_env(), folder)),
        start_worker(BenchWorker("bench.plain_app", plain_env, folder, extra_args=("-Q", "plain"))),
    ]
    client = redis.Redis.from_url(server.url)
    session = f"lat{uuid.uuid4().hex[:8]}"
    dex_times: list[float] = []
    early_times: list[float] = []
    record_times: list[float] = []
    decided_times: list[float] = []
    plain_times: list[float] = []
    dex_cpu: list[float] = []  # CPU of `request_call` in this process
    plain_cpu: list[float] = []  # CPU of `delay()` in this process
    try:
        for i in range(args.warmup + args.samples):
            time.sleep(args.pause)
            d, d_cpu = dex_wait_sample(dx, i, session)
            time.sleep(args.pause)
            early, early_cpu = dex_wait_sample(dx, i, session, recorded=False)
            time.sleep(args.pause)
            e, r = dex_sample(dx, client, dx.keys.events, i, session)
            time.sleep(args.pause)
            t0 = time.perf_counter()
            c0 = time.process_time()
            result = plain_app.noop.delay()
            p_cpu = time.process_time() - c0
            result.get(timeout=30)
            p = time.perf_counter() - t0
            if i >= args.warmup:
                dex_cpu.extend((d_cpu, early_cpu))
                plain_cpu.append(p_cpu)
                dex_times.append(d)
                early_times.append(early)
                record_times.append(r)
                decided_times.append(e)
                plain_times.append(p)
    finally:
        for w in workers:
            w.stop(warm=True)
        server.kill()
    print(f"{args.samples} samples each, {args.pause * 1000:.0f} ms idle before each")
    for name, values in (
        ("dex wait()          ", dex_times),
        ("dex wait(recorded=False)", early_times),
        ("dex (record in SQL) ", record_times),
        ("dex (ledger decided)", decided_times),
        ("plain               ", plain_times),
    ):
        print(
            f"{name}: p50 {percentile(values, 50) * 1e3:6.2f} ms  p99 "
            f"{percentile(values, 99) * 1e3:6.2f} ms  max {max(values) * 1e3:6.2f} ms"
        )
    for name, values in (
        ("dex wait()/plain", dex_times),
        ("dex wait(recorded=False)/plain", early_times),
        ("dex (record in SQL)/plain", record_times),
        ("dex (ledger decided)/plain", decided_times),
    ):
        print(
            f"ratio {name}: p50 {percentile(values, 50) / percentile(plain_times, 50):.2f}  "
            f"p99 {percentile(values, 99) / percentile(plain_times, 99):.2f}"
        )
    print(
        f"requester cpu: dex request_call mean {sum(dex_cpu) / len(dex_cpu) * 1e6:.0f} us, "
        f"p50 {percentile(dex_cpu, 50) * 1e6:.0f} us; plain delay() mean "
        f"{sum(plain_cpu) / len(plain_cpu) * 1e6:.0f} us, p50 {percentile(plain_cpu, 50) * 1e6:.0f}"
        f" us; dex - plain mean {(sum(dex_cpu) / len(dex_cpu) - sum(plain_cpu) / len(plain_cpu)) * 1e6:.0f} us"
    )
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
