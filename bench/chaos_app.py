"""Tools of the chaos run: one per effect class, each keeping its own side-effect log.

Every execution appends `start <key> <attempt> <pid>` before its work and `end <key> <attempt>
<pid>` after it to one append-only file (`$CHAOS_LOG`; one `write` of a short line with
`O_APPEND` is atomic between processes, and each line is fsynced). The log is the tools' own
account, independent of the ledger and SQL, so the checks in `bench/chaos.py` can compare them.
Chaos tools never ask for approval (`requires_approval=False`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from bench.common import announce_ready
from dex_celery import Dex, EffectClass, Settings, ToolContext, ToolPolicy

LOG_ENV = "CHAOS_LOG"


def note(what: str, ctx: ToolContext) -> None:
    line = f"{what} {ctx.idempotency_key} {ctx.attempt} {os.getpid()}\n".encode()
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def work(ctx: ToolContext, seconds: float = 0.0, n: int = 0) -> Any:
    """Runs `seconds` like tool code that cannot be stopped (it ignores cancellation). `n`
    numbers the planned call: distinct calls have distinct arguments, as a model's distinct
    requests do (the same write asked again in a session waits for a person, S5.4)."""
    note("start", ctx)
    if seconds > 0:
        time.sleep(seconds)
    note("end", ctx)
    return {"slept": seconds}


def build(settings: Settings, name: str = "bench_chaos") -> tuple[Celery, Dex]:
    celery = Celery(name)
    dx = Dex(celery, settings)
    for effect in EffectClass:
        dx.tool(f"chaos_{effect.value}", policy=ToolPolicy(effect=effect, requires_approval=False))(
            work
        )
    return celery, dx


app, dex = build(Settings.from_env())
announce_ready()
