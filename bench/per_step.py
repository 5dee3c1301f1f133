"""Per-step latency: an agent session of N sequential lightweight tool calls, each requested and
waited for before the next, dex-celery against plain Celery and DBOS in the same run.

The shape of the Windmill benchmark's "400 lightweight tasks" run one after the other (README,
"Per step, against published figures"). A step is, on each side:

- dex    one turn of one tool call through the agent-loop helper `run_tool_calls` (request in
         one SQL transaction and one `open` script, then `DexClient.wait` until the SQL record):
         `noop` (`read`) or, with `--tool write`, `noop_write` (`non_idempotent_write`, no
         approval: its claim commits to SQL before the body runs); both bodies are empty;
- plain  `noop.delay().get()` on plain Celery with a Redis result backend (`bench/plain_app.py`;
         Celery has no effect classes, so the same task for either `--tool`);
- dbos   `DBOSClient.enqueue(...).get_result()` of a one-step workflow on DBOS's durable queue
         (`bench/dbos_app.py`, as `bench/peers.py` runs it; skipped with a line saying why when
         the `dbos` package or the PostgreSQL at 127.0.0.1:5432 is missing).

Every round runs one session of `--steps` steps on each side (after `--warmup` untimed steps),
the order rotating each round (`bench/sides.py`). Reports each side's p50 / p99 / mean per step
and session wall, the ratios against plain Celery, Redis's network round trips and commands per
step over the timed sessions, and, from one more untimed session of `--monitor-steps` under
`MONITOR`, the commands each process sent per step.

    .venv/bin/python -m bench.per_step --steps 400 --rounds 3 [--tool write] \
        [--database postgres] [--pool threads]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from bench.common import header
from bench.sides import (
    DEX,
    PLAIN,
    Sides,
    add_side_arguments,
    latency_lines,
    new_session,
    redis_lines,
    role_table,
    setup_line,
    started_for,
    timed_rounds,
)
from dex_celery import run_tool_calls

TOOLS = {"read": "noop", "write": "noop_write"}


def tool_call(call_id: str, name: str) -> dict[str, Any]:
    """One tool call as a model writes it (OpenAI style)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def stepper(sides: Sides, side: str, tool: str) -> tuple[Callable[[int], None], str | None]:
    """The function running step `i` of a new session on `side`, and the dex session's id."""
    if side == DEX:
        client, session = sides.dx.client(), new_session()

        def dex_step(i: int) -> None:
            (message,) = run_tool_calls(client, session, f"t{i}", [tool_call("c", tool)])
            if message["content"].startswith("Error"):
                raise SystemExit(f"dex step {i} failed: {message['content']}")

        return dex_step, session
    if side == PLAIN:
        noop = sides.plain.noop

        def plain_step(_i: int) -> None:
            noop.delay().get(timeout=30)

        return plain_step, None
    peer = sides.peer
    assert peer is not None

    def dbos_step(_i: int) -> None:
        peer.sample()

    return dbos_step, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per session")
    parser.add_argument("--tool", choices=tuple(TOOLS), default="read")
    parser.add_argument("--monitor-steps", type=int, default=100, help="steps under MONITOR")
    add_side_arguments(parser)
    args = parser.parse_args(argv)
    header(
        f"per_step: {args.steps} sequential {args.tool} steps, dex-celery vs plain Celery "
        "delay().get() and DBOS"
    )
    tool = TOOLS[args.tool]
    with started_for("per-step", args) as sides:
        sessions = timed_rounds(
            sides, args, args.steps, "step", lambda side: stepper(sides, side, tool)
        )
        counted = {}
        for side in (PLAIN, DEX):
            step, _ = stepper(sides, side, tool)

            def monitored(step: Callable[[int], None] = step) -> None:
                for i in range(args.monitor_steps):
                    step(i)

            counted[side] = sides.commands_by_role(side, monitored)
        print()
        print(
            f"{args.steps} steps x {args.rounds} rounds, {args.warmup} untimed first; tool "
            f"{args.tool} (dex `{tool}`); {setup_line(args, sides)}"
        )
        for line in latency_lines(sessions, sides.names, "step"):
            print(line)
        for line in redis_lines(sides, sessions, "step"):
            print(line)
        print(f"commands sent by each process, {args.monitor_steps} steps under MONITOR:")
        for line in role_table(counted, args.monitor_steps, "step"):
            print(line)
        if sides.skipped:
            print(sides.skipped)
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
