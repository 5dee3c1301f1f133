"""Agent turn: 8 parallel reads, then 1 write that depends on them, repeated K turns, dex-celery
against plain Celery and DBOS in the same run.

What one model turn of a tool-using agent asks: it reads several things at once, then writes
once it has read them. A turn is, on each side (`--reads` reads, 8 by default):

- dex    `run_tool_calls` with the reads (`noop`, `read`) in one call: one request of all of them
         (one SQL transaction, their `open` scripts in one pipeline), one `wait` for all; then
         `run_tool_calls` with the write (`noop_write`, `non_idempotent_write`, no approval), as
         the model's next message; every body is empty;
- plain  `group(noop.s() x reads).apply_async().join()`, then `noop.delay().get()` (Redis result
         backend, `bench/plain_app.py`). `join()` waits for each result in turn; the group's
         `get()` (`--plain-group-get get`: Celery's `join_native`, draining the backend's
         messages at `interval=0.5` by default) ended each turn about half a second late here
         (docs/benchmarks.md, section 23), so the faster one is the baseline;
- dbos   the reads enqueued through `DBOSClient` one by one and each `get_result()` awaited, then
         the write's workflow enqueued and awaited (`bench/dbos_app.py`'s one-step workflow on the
         durable queue, as `bench/peers.py` runs it; skipped with a line saying why when the
         `dbos` package or the PostgreSQL at 127.0.0.1:5432 is missing).

Every round runs one session of `--turns` turns on each side, the order rotating each round
(`bench/sides.py`). Reports each side's turn wall p50 / p99 / mean, the ratios against plain
Celery, and Redis's network round trips and commands per turn.

    .venv/bin/python -m bench.agent_turn --turns 100 --rounds 3 [--database postgres]
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Callable

from celery import group

from bench.common import header
from bench.per_step import TOOLS, tool_call
from bench.sides import (
    DEX,
    PLAIN,
    Sides,
    add_side_arguments,
    latency_lines,
    new_session,
    redis_lines,
    setup_line,
    started_for,
    timed_rounds,
)
from dex_celery import run_tool_calls


def turner(
    sides: Sides, side: str, reads: int, group_get: str = "join"
) -> tuple[Callable[[int], None], str | None]:
    """The function running turn `k` of a new session on `side`, and the dex session's id."""
    if side == DEX:
        client, session = sides.dx.client(), new_session()
        read_calls = [tool_call(f"r{j}", TOOLS["read"]) for j in range(reads)]
        write_call = [tool_call("w", TOOLS["write"])]

        def dex_turn(k: int) -> None:
            messages = run_tool_calls(client, session, f"k{k}r", read_calls)
            messages += run_tool_calls(client, session, f"k{k}w", write_call)
            for m in messages:
                if m["content"].startswith("Error"):
                    raise SystemExit(f"dex turn {k} failed: {m['content']}")

        return dex_turn, session
    if side == PLAIN:
        noop = sides.plain.noop

        def plain_turn(_k: int) -> None:
            result = group(noop.s() for _ in range(reads)).apply_async()
            if group_get == "join":
                result.join(timeout=30)
            else:
                result.get(timeout=30)
            noop.delay().get(timeout=30)

        return plain_turn, None
    peer = sides.peer
    assert peer is not None

    def dbos_turn(_k: int) -> None:
        handles = [peer.enqueue(f"r{uuid.uuid4().hex}") for _ in range(reads)]
        for h in handles:
            assert h.get_result(polling_interval_sec=peer.poll) == "ok"
        peer.sample()  # the write: enqueued and awaited

    return dbos_turn, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=8, help="parallel reads per turn")
    parser.add_argument("--warmup", type=int, default=5, help="untimed turns per session")
    add_side_arguments(parser)
    parser.add_argument(
        "--plain-group-get",
        choices=("join", "get"),
        default="join",
        help="how plain Celery waits for the group: join() (each result) or get() (native)",
    )
    args = parser.parse_args(argv)
    header(
        f"agent_turn: {args.reads} parallel reads then 1 write per turn, dex-celery vs plain "
        "Celery and DBOS"
    )
    with started_for("agent-turn", args) as sides:
        sessions = timed_rounds(
            sides,
            args,
            args.turns,
            "turn",
            lambda side: turner(sides, side, args.reads, args.plain_group_get),
        )
        print()
        print(
            f"{args.turns} turns x {args.rounds} rounds of {args.reads} reads + 1 write, "
            f"{args.warmup} untimed first; {setup_line(args, sides)}; plain waits for the "
            f"group with {args.plain_group_get}()"
        )
        for line in latency_lines(sessions, sides.names, "turn"):
            print(line)
        for line in redis_lines(sides, sessions, "turn"):
            print(line)
        if sides.skipped:
            print(sides.skipped)
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
