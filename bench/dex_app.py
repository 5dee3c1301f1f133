"""The dex-celery side of the throughput, latency and detection benchmarks.

Settings come from the environment (`DEX_*`), as in a deployment. Tools:
- `noop`: a `read` that does nothing (throughput, latency, per-step, agent turn);
- `noop_write`: a `non_idempotent_write` that does nothing, no approval, no repeat guard (the
  per-step and agent-turn benchmarks' write: what dex-celery charges a write, not a body's work);
- `hold_<effect>`: runs for `seconds`, one per effect class, no approval (detection).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, signals
from sqlalchemy import event
from sqlalchemy.engine import Engine

from bench import thread_profiles
from bench.common import announce_ready
from dex_celery import Dex, EffectClass, Settings, ToolContext, ToolPolicy

thread_profiles.arm_from_env()  # `bench.cpu_profile` only: inert unless BENCH_PROFILE_DIR is set


def build(settings: Settings, name: str = "bench_dex") -> tuple[Celery, Dex]:
    """The app with the benchmark tools; the drivers build their own client-side copy."""
    celery = Celery(name)
    dx = Dex(celery, settings)

    @dx.tool(policy=ToolPolicy(effect=EffectClass.READ))
    def noop(ctx: ToolContext) -> Any:
        """Does nothing: the cost measured is the system's own."""
        return None

    @dx.tool(
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False, repeat_guard=False
        )
    )
    def noop_write(ctx: ToolContext) -> Any:
        """Does nothing, as a write: its claim and the write fence are what is measured."""
        return None

    for effect in EffectClass:
        # No repeat guard: a benchmark asks for many identical calls on purpose.
        dx.tool(
            f"hold_{effect.value}",
            policy=ToolPolicy(effect=effect, requires_approval=False, repeat_guard=False),
        )(_hold)
    return celery, dx


def _hold(ctx: ToolContext, seconds: float = 60.0, first_only: bool = True) -> Any:
    """Runs `seconds` (until fenced); with `first_only`, later attempts return at once."""
    if first_only and ctx.attempt > 1:
        return "retried"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.05)
    return "held"


app, dex = build(Settings.from_env())

announce_ready()

#: Set to a folder: each worker process counts its SQL commits and writes `commits-<pid>` there
#: at shutdown (throughput benchmark; one in-process counter, no extra round trip per call).
SQL_COUNT_ENV = "BENCH_SQL_COUNT_DIR"
_commits = {"n": 0}

if os.environ.get(SQL_COUNT_ENV):

    @event.listens_for(Engine, "commit")
    def _count_commit(_conn: Any) -> None:
        _commits["n"] += 1

    @signals.worker_process_shutdown.connect(weak=False)
    def _write_commits(**_: Any) -> None:
        folder = Path(os.environ[SQL_COUNT_ENV])
        (folder / f"commits-{os.getpid()}").write_text(str(_commits["n"]))
