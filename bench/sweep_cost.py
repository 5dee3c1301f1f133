"""Sweep cost against history: one `Sweeper.sweep_once()` with 1,000 and with 1,000,000 finished
calls recorded, and with 10,000 attempts in flight of which 100 are due.

History is written in bulk, straight to SQL (`dex_tool_calls` rows in terminal statuses) and,
for finished ledger entries still inside their `finished_ttl`, straight to Redis (call hashes
with a TTL, in no index). The sweep reads deadline indexes (`ZRANGEBYSCORE ... LIMIT`) and
indexed SQL statuses, so history should not move its cost.

    .venv/bin/python -m bench.sweep_cost --history 1000,1000000
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import redis
from sqlalchemy import insert

from bench.common import RedisServer, header, median, workdir
from dex_celery import Settings
from dex_celery.engine.request.dispatch import CallRequest
from dex_celery.engine.upkeep.sweep import Sweeper
from dex_celery.store.schema import tool_calls

CHUNK = 20_000


def template(dx: Any) -> dict[str, Any]:
    """A real recorded row to clone (policy snapshot and all)."""
    dx.client().request_calls([CallRequest("tmpl", "t", "c", "hold_non_idempotent_write", {})])
    with dx.store.engine.connect() as conn:
        row = conn.execute(tool_calls.select()).mappings().first()
    assert row is not None
    return dict(row)


def add_history(dx: Any, tmpl: dict[str, Any], start: int, count: int, ledger_entries: int) -> None:
    now = time.time()
    statuses = ("succeeded", "failed", "outcome_unknown", "rejected")
    with dx.store.engine.begin() as conn:
        for base in range(start, start + count, CHUNK):
            rows = []
            for i in range(base, min(start + count, base + CHUNK)):
                session = f"h{i // 100}"
                rows.append(
                    {
                        **tmpl,
                        "key": f"{session}/t{i % 100}/c",
                        "session_id": session,
                        "turn_id": f"t{i % 100}",
                        "tool_call_id": "c",
                        "status": statuses[i % 4],
                        "attempts": 1,
                        "requested_at": now - 3600 + i * 1e-6,
                        "finished_at": now - 3000 + i * 1e-6,
                    }
                )
            conn.execute(insert(tool_calls), rows)
    pipe = dx.ledger.client.pipeline(transaction=False)
    for i in range(start, start + min(count, ledger_entries)):
        key = dx.keys.call(f"h{i // 100}/t{i % 100}/c")
        pipe.hset(key, mapping={"status": "succeeded", "n": 1, "state": "succeeded", "log": ""})
        pipe.expire(key, 3600)
        if i % 5000 == 0:
            pipe.execute()
    pipe.execute()


def time_sweeps(sweeper: Sweeper, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sweeper.sweep_once()
        times.append(time.perf_counter() - t0)
    return times


def breakdown(dx: Any, repeat: int) -> str:
    """Median time of each read one idle sweep makes: the Redis indexes and the two SQL scans."""
    now = time.time()
    parts: dict[str, Any] = {
        "4 ZRANGEBYSCORE": lambda: [
            dx.ledger.due(i, now=now, limit=500)
            for i in (
                dx.keys.lease_index,
                dx.keys.queue_index,
                dx.keys.close_index,
                dx.keys.unrecorded_index,
            )
        ],
        "SQL approvals_due": lambda: dx.store.approvals_due(now, limit=500),
        "SQL in_flight_before": lambda: dx.store.in_flight_before(now - 10, limit=500),
        "SQL connect only": lambda: dx.store.engine.connect().close(),
    }
    out = []
    for name, fn in parts.items():
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out.append(f"{name} {median(times) * 1e3:.2f} ms")
    return ", ".join(out)


def in_flight(dx: Any, n: int, due: int, repeat: int) -> tuple[list[float], int]:
    """`n` running attempts with far leases; then `due` whose lease lapsed, swept, `repeat` times."""
    ledger = dx.ledger
    requests = [
        CallRequest(f"f{i // 100}", f"t{i % 100}", "c", "hold_non_idempotent_write", {})
        for i in range(n)
    ]
    client = dx.client()
    for b in range(0, n, 500):
        client.request_calls(requests[b : b + 500])
    for i, req in enumerate(requests):
        ledger.claim(f"{req.session_id}/{req.turn_id}/c", 1, owner="bench", fence=f"f{i}")
    sweeper = dx.sweeper
    sweeper.sweep_once()
    times: list[float] = []
    moved = 0
    for r in range(repeat):
        # Claim long ago, so the lease has lapsed: the ledger's clock held an hour back.
        ledger.client.set(ledger.keys.clock, repr(float(ledger.client.time()[0]) - 3600))
        batch = [
            CallRequest(f"d{r}", f"t{i}", "c", "hold_non_idempotent_write", {}) for i in range(due)
        ]
        client.request_calls(batch)
        for i, req in enumerate(batch):
            ledger.claim(f"{req.session_id}/{req.turn_id}/c", 1, owner="bench", fence=f"d{i}")
        ledger.client.delete(ledger.keys.clock)
        t0 = time.perf_counter()
        report = sweeper.sweep_once()
        times.append(time.perf_counter() - t0)
        moved += report.lost
    return times, moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", default="1000,1000000", help="finished calls, ascending")
    parser.add_argument(
        "--ledger-entries",
        type=int,
        default=100_000,
        help="at most this many finished ledger entries (hashes with a TTL)",
    )
    parser.add_argument("--repeat", type=int, default=30, help="sweeps timed per case")
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--due", type=int, default=100)
    parser.add_argument("--due-repeat", type=int, default=5)
    args = parser.parse_args(argv)
    header("sweep cost against history")
    from bench.dex_app import build

    folder = workdir("sweep")
    server = RedisServer(folder / "redis").start()
    try:
        settings = Settings(
            redis_url=server.url,
            database_url=f"sqlite:///{folder / 'dex.db'}",
            key_prefix=f"sw{uuid.uuid4().hex[:6]}",
            orphan_grace=1.0,
        )
        _app, dx = build(settings, "sweep_bench")
        dx.store.create_schema()
        tmpl = template(dx)
        tmpl["status"] = "succeeded"
        dx.store.record_outcome  # noqa: B018 (the engine exists)
        sweeper = dx.sweeper
        have = 0
        results: dict[int, float] = {}
        for target in (int(x) for x in args.history.split(",")):
            t0 = time.perf_counter()
            add_history(dx, tmpl, have, target - have, args.ledger_entries)
            have = target
            print(
                f"  wrote history up to {target:,} calls in {time.perf_counter() - t0:.1f}s",
                flush=True,
            )
            times = time_sweeps(sweeper, args.repeat)
            results[target] = median(times)
            print(
                f"history {target:>9,}: sweep median {median(times) * 1e3:7.2f} ms  "
                f"p90 {statistics.quantiles(times, n=10)[-1] * 1e3:7.2f} ms  ({args.repeat} sweeps, "
                "nothing due)"
            )
            print(f"  of which: {breakdown(dx, args.repeat)}")
        first, last = min(results), max(results)
        ratio = results[last] / results[first]
        print(
            f"ratio {last:,} / {first:,}: {ratio:.2f} "
            f"({'ok' if ratio <= 1.5 else 'MISSES'} target <= 1.5)"
        )
        times, moved = in_flight(dx, args.in_flight, args.due, args.due_repeat)
        print(
            f"in flight {args.in_flight:,} + {args.due} due: sweep median {median(times) * 1e3:.1f} ms "
            f"(max {max(times) * 1e3:.1f} ms, {args.due_repeat} sweeps, {moved} attempts moved "
            f"to outcome_unknown and recorded in SQL)"
        )
        info: Any = redis.Redis.from_url(server.url).info("memory")
        print(f"redis used_memory at the end: {info['used_memory_human']}")
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
