"""Repeat guard cost against history (S5.4): requests per second with 1,000 and 1,000,000
finished calls in the session, for a guarded write whose arguments are new, a guarded write that
repeats a finished call, the same write with the guard off, and a read (which skips the guard).

History is written in bulk, straight to SQL: finished `bench_write` calls (a `non_idempotent_write` needing no approval) of one
session, each with its own digest and its slot in `dex_repeat_guards`, so the guard's table and
the session's calls hold the whole history. Every timed request goes through
`DexClient.request_call` (validate, record, open in the ledger, publish to the broker).

    .venv/bin/python -m bench.repeat_guard --history 1000,1000000
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import insert, select

from bench.common import RedisServer, header, median, workdir
from dex_celery import EffectClass, Settings, ToolContext, ToolPolicy
from dex_celery.store.schema import repeat_guards, tool_calls
from dex_celery.store.values import arguments_json
from dex_celery.tools.repeat_digest import repeat_digest

CHUNK = 20_000
SESSION = "bench"
WRITE = "bench_write"


def _noop(ctx: ToolContext, **arguments: Any) -> Any:
    return "ok"


def add_history(dx: Any, tmpl: dict[str, Any], start: int, count: int) -> None:
    """`count` finished guarded calls of the session, each with its slot (a distinct digest)."""
    now = time.time()
    with dx.store.engine.begin() as conn:
        for base in range(start, start + count, CHUNK):
            calls, slots = [], []
            for i in range(base, min(start + count, base + CHUNK)):
                key = f"{SESSION}/h{i}/c"
                arguments = arguments_json({"n": i})
                digest = repeat_digest(WRITE, arguments, "")
                calls.append(
                    {
                        **tmpl,
                        "key": key,
                        "turn_id": f"h{i}",
                        "arguments": arguments,
                        "status": "succeeded",
                        "attempts": 1,
                        "repeat_digest": digest,
                        "requested_at": now - 3600 + i * 1e-6,
                        "finished_at": now - 3000 + i * 1e-6,
                    }
                )
                slots.append({"session_id": SESSION, "digest": digest, "holder": key})
            conn.execute(insert(tool_calls), calls)
            conn.execute(insert(repeat_guards), slots)


def rate(fn: Callable[[int], Any], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", default="1000,1000000", help="finished calls, ascending")
    parser.add_argument(
        "--requests",
        type=int,
        default=300,
        help="timed requests per case and round (rounds x requests <= the smallest history, so "
        "each repeat meets a finished call)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every case")
    parser.add_argument("--database-url", default=None, help="default: SQLite in the work dir")
    args = parser.parse_args(argv)
    header("repeat guard cost against history")
    from bench.dex_app import build

    folder = workdir("repeat")
    server = RedisServer(folder / "redis").start()
    try:
        settings = Settings(
            redis_url=server.url,
            database_url=args.database_url or f"sqlite:///{folder / 'dex.db'}",
            key_prefix=f"rg{uuid.uuid4().hex[:6]}",
        )
        _app, dx = build(settings, "repeat_bench")
        write = ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False)
        dx.tool(name=WRITE, policy=write)(_noop)
        dx.tool(
            name="unguarded_write",
            policy=ToolPolicy(
                effect=EffectClass.NON_IDEMPOTENT_WRITE,
                requires_approval=False,
                repeat_guard=False,
            ),
        )(_noop)
        dx.store.create_schema()
        client = dx.client()
        client.request_call(SESSION, "tmpl", "c", WRITE, {"n": -1})
        with dx.store.engine.connect() as conn:
            tmpl = dict(conn.execute(select(tool_calls)).mappings().one())
        have = 0
        for run, target in enumerate(int(x) for x in args.history.split(",")):
            t0 = time.perf_counter()
            add_history(dx, tmpl, have, target - have)
            have = target
            print(f"  wrote history up to {target:,} calls in {time.perf_counter() - t0:.1f}s")
            n = args.requests
            cases: dict[str, Callable[[int], Any]] = {
                # New arguments: the slot's INSERT is the guard's whole cost.
                "guarded write, new arguments": lambda i, r=run: client.request_call(
                    SESSION, f"new{r}-{i}", "c", WRITE, {"n": f"new{r}-{i}"}
                ),
                # Repeats a finished call: INSERT refused, one primary-key lookup, one CAS.
                "guarded write, repeats a finished call": lambda i, r=run, t=target: (
                    client.request_call(
                        SESSION, f"rep{r}-{i}", "c", WRITE, {"n": (i * 7919 + r) % t}
                    )
                ),
                "write, guard off": lambda i, r=run: client.request_call(
                    SESSION, f"off{r}-{i}", "c", "unguarded_write", {"n": f"off{r}-{i}"}
                ),
                "read (skips the guard)": lambda i, r=run: client.request_call(
                    SESSION, f"read{r}-{i}", "c", "noop", {}
                ),
            }
            rates: dict[str, list[float]] = {name: [] for name in cases}
            for fn in cases.values():
                fn(-1)  # warm
            for rnd in range(args.rounds):  # cases interleaved, so load drifts hit all alike
                for name, fn in cases.items():
                    rates[name].append(rate(lambda i, fn=fn, base=rnd * n: fn(base + i), n))
            for name, got in rates.items():
                print(
                    f"history {target:>9,}: {name:<40} median {median(got):7.0f} requests/s "
                    f"({', '.join(f'{x:.0f}' for x in got)})"
                )
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
