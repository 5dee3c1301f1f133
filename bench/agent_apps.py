"""The dex-celery app of the agent-shaped benchmark (`bench/agent_shaped.py`).

Plain Celery's side reuses `bench/io_apps.py` (`io.sleep`, counted by `INCR`) for the mix and
`bench/plain_app.py` (`bench.hold`) for the in-flight run, so both sides run the same waits.

Tools, each waiting `seconds` like a call to a slow API:
- `agent_read` (`read`), `agent_idempotent_write` (`idempotent_write`);
- `agent_write` (`non_idempotent_write`, no approval) and `agent_write_approved` (the same class,
  asking a person first: the driver's approver decides it as soon as it waits);
- `agent_hold`: a `read` that `INCR`s `bench:agent:started` on the ledger's Redis before it
  waits, so the in-flight run knows when every call is running.
The repeat guard is off: the driver asks for many similar calls on purpose (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import Celery

from bench.common import announce_ready, broker_pool_from_env
from dex_celery import Dex, EffectClass, Settings, ToolContext, ToolPolicy

STARTED_KEY = "bench:agent:started"

#: Tool name -> (effect class, needs approval). The driver draws its mix from these names.
TOOLS: dict[str, tuple[EffectClass, bool]] = {
    "agent_read": (EffectClass.READ, False),
    "agent_idempotent_write": (EffectClass.IDEMPOTENT_WRITE, False),
    "agent_write": (EffectClass.NON_IDEMPOTENT_WRITE, False),
    "agent_write_approved": (EffectClass.NON_IDEMPOTENT_WRITE, True),
}


def build(settings: Settings, name: str = "bench_agent_dex") -> tuple[Celery, Dex]:
    """The app with the agent-shaped tools; the driver builds its own client-side copy."""
    celery = Celery(name)
    dx = Dex(celery, settings)
    for tool, (effect, approval) in TOOLS.items():
        policy = ToolPolicy(effect=effect, requires_approval=approval, repeat_guard=False)
        dx.tool(tool, policy=policy)(_wait)
    started: dict[str, redis.Redis] = {}

    @dx.tool(policy=ToolPolicy(effect=EffectClass.READ, repeat_guard=False))
    def agent_hold(ctx: ToolContext, seconds: float, n: int = 0) -> Any:
        """Counts itself running, then waits (the in-flight run kills the worker first)."""
        if not started:
            started["r"] = redis.Redis.from_url(settings.redis_url)
        started["r"].incr(STARTED_KEY)
        time.sleep(seconds)
        return None

    return celery, dx


def _wait(ctx: ToolContext, seconds: float, n: int = 0) -> Any:
    """Waits `seconds`; `n` keeps each call's arguments distinct."""
    time.sleep(seconds)
    return None


app, dex = build(Settings.from_env())

broker_pool_from_env(app)
announce_ready()
