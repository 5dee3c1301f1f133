"""Agent-shaped benchmark: IO-bound tools of mixed effect classes, dex-celery against plain Celery.

Two modes, each on one private redis-server per run, plain Celery and dex-celery side by side:

**Mix** (default). Every call waits a time drawn from 20-500 ms (uniform, `random.Random` seeded
with `--seed` and the round, so the dex and plain sides of a round run the same waits). On the dex
side each call is also drawn an effect class (`--mix` percent of reads / idempotent writes /
non-idempotent writes); `--approve-fraction` of the non-idempotent writes ask for approval, which
an approver thread in the driver gives through `Approvals.approve` as soon as they wait. Plain
Celery runs the same waits as `io.sleep` (`bench/io_apps.py`: `delay`-style publish, completion
counted by `INCR`); dex-celery's calls go through `DexClient.request_calls` and are done when every
call has its terminal record in SQL. Rounds alternate plain / dex, each with a fresh worker on the
same pool (`--pool threads -c 50` or `--pool gevent -c 200`). Reports the medians of calls/s, the
ratio dex/plain (median of the per-round ratios) and the median approval wait (request ->
decision recorded) the approved calls added.

**In flight** (`--in-flight N`). N calls that wait `--hold` seconds are all running at once on one
`gevent` worker with `-c N`; the redis-server's CPU per second (`INFO cpu`, user + system) is
measured over `--window` seconds while nothing is in flight and then while all N run. On the dex
side that is the heartbeats of N running attempts and the sweeps of celery beat's sweeper; on
plain Celery's side (`bench.hold`, `bench/plain_app.py`), the broker's own bookkeeping of N
unacknowledged late-ack messages.

    .venv/bin/python -m bench.agent_shaped --pool threads --concurrency 50 --calls 2000 --rounds 3
    .venv/bin/python -m bench.agent_shaped --pool gevent --concurrency 200 --calls 2000 --rounds 3
    .venv/bin/python -m bench.agent_shaped --in-flight 5000
"""

from __future__ import annotations

import argparse
import random
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import func, select

from bench.common import (
    MAX_CONNECTIONS_ENV,
    BenchWorker,
    RedisServer,
    commandstats,
    header,
    median,
    redis_cpu,
    stats_delta,
    wait_for,
    workdir,
)

#: The dex tools of the mix, by class: (plain tool name unused; plain runs `io.sleep` for all).
READ, IDEMPOTENT, WRITE, APPROVED = (
    "agent_read",
    "agent_idempotent_write",
    "agent_write",
    "agent_write_approved",
)
PLAIN_COUNTER = "bench:io:done"  # bench/io_apps.py's completion counter
PLAIN_RUNS = "bench:plain:runs"  # bench/plain_app.py's start/end log
STARTED_KEY = "bench:agent:started"  # bench/agent_apps.py's `agent_hold` counter


@dataclass(frozen=True, slots=True)
class Draw:
    """One call of a round: how long it waits and which dex tool (effect class) it is."""

    seconds: float
    tool: str


def draws(n: int, seed: int, mix: tuple[float, float, float], approve: float) -> list[Draw]:
    """`n` calls drawn from `seed`: the same list for the plain and the dex side of a round."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        seconds = rng.uniform(0.02, 0.5)
        x = rng.random() * sum(mix)
        if x < mix[0]:
            tool = READ
        elif x < mix[0] + mix[1]:
            tool = IDEMPOTENT
        else:
            tool = APPROVED if rng.random() < approve else WRITE
        out.append(Draw(round(seconds, 4), tool))
    return out


def dex_env(url: str, database: str) -> dict[str, str]:
    return {
        "DEX_REDIS_URL": url,
        "DEX_DATABASE_URL": database,
        "DEX_KEY_PREFIX": "bench",
        "DEX_TASK_EVENTS": "0",
    }


def pool_env(concurrency: int) -> dict[str, str]:
    """Both sides' workers: a Kombu pool big enough for every thread or greenlet to ack at once
    (bench/common.py, `broker_pool_from_env`)."""
    return {MAX_CONNECTIONS_ENV: str(max(10, 2 * concurrency))}


def dex_app(url: str, database: str) -> Any:
    """The driver's client-side copy of `bench/agent_apps.py`, schema created."""
    from bench.agent_apps import build
    from dex_celery import Settings

    settings = Settings(redis_url=url, database_url=database, key_prefix="bench", task_events=False)
    _app, dx = build(settings, "bench_agent_client")
    dx.store.create_schema()
    return dx


# --- mix ------------------------------------------------------------------------------------


def run_plain(folder: Path, url: str, rounds: list[list[Draw]], args: argparse.Namespace) -> float:
    """Plain Celery: publish every wait as `io.sleep`, done when the counter reaches them all."""
    from celery import Celery

    client_app = Celery("bench_agent_plain_client", broker=url)
    client_app.conf.update(task_serializer="json", accept_content=["json"])
    env = {"BENCH_SIDE": "plain", "BENCH_BROKER_URL": url, **pool_env(args.concurrency)}
    worker = BenchWorker(
        "bench.io_apps", env, folder, concurrency=args.concurrency, pool=args.pool
    ).start()
    r = redis.Redis.from_url(url)
    rate = 0.0
    try:
        for calls in rounds:
            r.set(PLAIN_COUNTER, 0)
            n = len(calls)
            t0 = time.perf_counter()
            with client_app.producer_or_acquire() as producer:
                for d in calls:
                    client_app.send_task("io.sleep", args=(d.seconds,), producer=producer)

            def done(n: int = n) -> bool:
                return int(r.get(PLAIN_COUNTER) or 0) >= n

            wait_for(
                done,
                timeout=600,
                what=f"{n} plain completions",
                interval=0.005,
            )
            rate = n / (time.perf_counter() - t0)
    finally:
        worker.stop(warm=True)
    return rate


class Approver(threading.Thread):
    """Approves every call of `session` as soon as it waits (the approvals API, S6)."""

    def __init__(self, dx: Any, session: str) -> None:
        super().__init__(daemon=True)
        self.dx, self.session = dx, session
        self.stopping = threading.Event()
        self.approved = 0

    def run(self) -> None:
        approvals = self.dx.approvals
        while not self.stopping.is_set():
            waiting = approvals.pending(self.session, limit=500)
            for p in waiting:
                approvals.approve(p.key, "bench-approver")
                self.approved += 1
            if not waiting:
                self.stopping.wait(0.005)


def run_dex(
    folder: Path, url: str, rounds: list[list[Draw]], args: argparse.Namespace
) -> tuple[float, list[float]]:
    """dex-celery: the drawn calls through `request_calls`; done when all have terminal records.

    Returns calls/s of the last (measured) list and the approval waits of its approved calls."""
    from dex_celery.engine.request.dispatch import CallRequest
    from dex_celery.store.schema import tool_calls

    database = f"sqlite:///{folder / f'dex-{uuid.uuid4().hex[:8]}.db'}"
    dx = dex_app(url, database)
    worker = BenchWorker(
        "bench.agent_apps",
        {**dex_env(url, database), **pool_env(args.concurrency)},
        folder,
        concurrency=args.concurrency,
        pool=args.pool,
    ).start()
    client = dx.client()
    rate, waits = 0.0, list[float]()
    try:
        for calls in rounds:
            session = f"s{uuid.uuid4().hex[:12]}"
            approver = Approver(dx, session)
            approver.start()
            keys: list[str] = []
            t0 = time.perf_counter()
            for start in range(0, len(calls), args.batch):
                batch = [
                    CallRequest(
                        session, f"t{start}", f"c{i}", d.tool, {"seconds": d.seconds, "n": i}
                    )
                    for i, d in enumerate(calls[start : start + args.batch], start)
                ]
                records = client.request_calls(batch)
                keys += [rec.key for rec in records if rec.tool_name == APPROVED]
            query = (
                select(func.count())
                .select_from(tool_calls)
                .where(tool_calls.c.session_id == session, tool_calls.c.finished_at.is_not(None))
            )

            def done(n: int = len(calls), query: Any = query) -> bool:
                with dx.store.engine.connect() as conn:
                    return int(conn.execute(query).scalar_one()) >= n

            wait_for(done, timeout=600, what=f"{len(calls)} dex terminal records", interval=0.01)
            rate = len(calls) / (time.perf_counter() - t0)
            approver.stopping.set()
            approver.join()
            failed = _not_succeeded(dx, session)
            if failed:
                raise SystemExit(f"dex calls did not all succeed: {failed}")
            waits = []
            for key in keys:
                rec = client.get_call(key)
                assert rec.approval is not None, key
                waits.append(rec.approval.decided_at - rec.requested_at)
    finally:
        worker.stop(warm=True)
    return rate, waits


def _not_succeeded(dx: Any, session: str) -> dict[str, int]:
    from dex_celery.store.schema import tool_calls

    query = (
        select(tool_calls.c.status, func.count())
        .where(tool_calls.c.session_id == session, tool_calls.c.status != "succeeded")
        .group_by(tool_calls.c.status)
    )
    with dx.store.engine.connect() as conn:
        return {str(s): int(n) for s, n in conn.execute(query)}


def mix_mode(args: argparse.Namespace) -> None:
    mix = tuple(float(x) for x in args.mix.split("/"))
    if len(mix) != 3:
        raise SystemExit("--mix is reads/idempotent writes/non-idempotent writes, e.g. 60/25/15")
    mix3 = (mix[0], mix[1], mix[2])
    header(
        f"agent_shaped: 20-500 ms tools, mix {args.mix}, approve {args.approve_fraction}, "
        "dex-celery vs plain Celery"
    )
    folder = workdir("agent")
    server = RedisServer(folder / "redis").start()
    flush = redis.Redis.from_url(server.url)
    plain_rates, dex_rates, all_waits = [], [], []
    try:
        for r in range(args.rounds):
            seed = args.seed * 1000 + r
            warm = draws(args.warmup, seed + 500, mix3, args.approve_fraction)
            calls = draws(args.calls, seed, mix3, args.approve_fraction)
            # Each side starts from an empty Redis: nothing the other side left (a message
            # restored after a failed ack, say) reaches its worker.
            flush.flushall()
            plain = run_plain(folder, server.url, [warm, calls], args)
            flush.flushall()
            dex, waits = run_dex(folder, server.url, [warm, calls], args)
            plain_rates.append(plain)
            dex_rates.append(dex)
            all_waits += waits
            print(
                f"round {r + 1}: plain {plain:8.1f} calls/s, dex {dex:8.1f} calls/s "
                f"(ratio {dex / plain:.2f}; {len(waits)} approved, median wait "
                f"{median(waits) * 1000:.0f} ms)",
                flush=True,
            )
    finally:
        server.kill()
    counts = {t: sum(d.tool == t for d in calls) for t in (READ, IDEMPOTENT, WRITE, APPROVED)}
    mean_wait = sum(d.seconds for d in calls) / len(calls)
    ratios = [d / p for p, d in zip(plain_rates, dex_rates, strict=True)]
    print()
    print(
        f"pool {args.pool} -c {args.concurrency}, {args.calls} calls x {args.rounds} rounds, "
        f"mean wait {mean_wait * 1000:.0f} ms (ideal {args.concurrency / mean_wait:.0f} calls/s); "
        f"last round's calls by tool: {counts}"
    )
    print(
        f"{args.pool}: plain {median(plain_rates):7.1f} calls/s, dex {median(dex_rates):7.1f} "
        f"calls/s, ratio dex/plain {median(ratios):.2f} (per round "
        + " ".join(f"{x:.2f}" for x in ratios)
        + ")"
    )
    print(
        f"{args.pool}: approval wait added (request -> approved): median "
        f"{median(all_waits) * 1000:.0f} ms over {len(all_waits)} calls"
    )


# --- in flight ------------------------------------------------------------------------------


def cpu_per_second(r: redis.Redis, window: float) -> tuple[float, dict[str, int]]:
    """redis-server CPU seconds per second over `window`, and the commands it ran meanwhile."""
    stats0, cpu0, t0 = commandstats(r), redis_cpu(r), time.perf_counter()
    time.sleep(window)  # the measured window itself, not a synchronisation
    cpu1, t1 = redis_cpu(r), time.perf_counter()
    return (cpu1 - cpu0) / (t1 - t0), stats_delta(stats0, commandstats(r))


def inflight_plain(
    folder: Path, url: str, args: argparse.Namespace
) -> tuple[float, float, dict[str, int]]:
    from celery import Celery

    client_app = Celery("bench_agent_plain_client", broker=url)
    client_app.conf.update(task_serializer="json", accept_content=["json"])
    env = {"BENCH_BROKER_URL": url}
    worker = BenchWorker(
        "bench.plain_app", env, folder, concurrency=args.in_flight, pool="gevent"
    ).start()
    r = redis.Redis.from_url(url)
    try:
        idle, _ = cpu_per_second(r, args.window)
        with client_app.producer_or_acquire() as producer:
            for i in range(args.in_flight):
                client_app.send_task("bench.hold", args=(f"h{i}", args.hold), producer=producer)
        wait_for(
            lambda: int(r.llen(PLAIN_RUNS)) >= args.in_flight,
            timeout=600,
            what=f"{args.in_flight} plain calls running",
            interval=0.05,
        )
        busy, commands = cpu_per_second(r, args.window)
        if int(r.llen(PLAIN_RUNS)) != args.in_flight:
            raise SystemExit("--hold is too short: plain calls ended inside the window")
    finally:
        worker.stop()
    return idle, busy, commands


def inflight_dex(
    folder: Path, url: str, args: argparse.Namespace
) -> tuple[float, float, dict[str, int]]:
    from devtools.processes import CeleryBeat
    from dex_celery.engine.request.dispatch import CallRequest

    database = f"sqlite:///{folder / 'dex-inflight.db'}"
    dx = dex_app(url, database)
    env = dex_env(url, database)
    worker = BenchWorker(
        "bench.agent_apps", env, folder, concurrency=args.in_flight, pool="gevent"
    ).start()
    beat = CeleryBeat("bench.agent_apps", env, folder / "beat").start()
    r = redis.Redis.from_url(url)
    client = dx.client()
    try:
        idle, _ = cpu_per_second(r, args.window)
        session = f"s{uuid.uuid4().hex[:12]}"
        for start in range(0, args.in_flight, args.batch):
            client.request_calls(
                [
                    CallRequest(
                        session, f"t{start}", f"c{i}", "agent_hold", {"seconds": args.hold, "n": i}
                    )
                    for i in range(start, min(args.in_flight, start + args.batch))
                ]
            )
        wait_for(
            lambda: int(r.get(STARTED_KEY) or 0) >= args.in_flight,
            timeout=600,
            what=f"{args.in_flight} dex calls running",
            interval=0.05,
        )
        busy, commands = cpu_per_second(r, args.window)
        if _not_succeeded(dx, session).get("pending", 0) != args.in_flight:
            raise SystemExit("--hold is too short: dex calls ended inside the window")
    finally:
        beat.stop()
        worker.stop()
    return idle, busy, commands


def inflight_mode(args: argparse.Namespace) -> None:
    header(
        f"agent_shaped --in-flight {args.in_flight}: redis-server CPU while calls wait "
        f"{args.hold:.0f} s, dex-celery vs plain Celery"
    )
    folder = workdir("agent-inflight")
    server = RedisServer(folder / "redis").start()
    results: dict[str, tuple[float, float, dict[str, int]]] = {}
    try:
        results["plain"] = inflight_plain(folder, server.url, args)
        redis.Redis.from_url(server.url).flushall()
        results["dex"] = inflight_dex(folder, server.url, args)
    finally:
        server.kill()
    print()
    print(
        f"{args.in_flight} calls in flight on gevent -c {args.in_flight}, window {args.window:.0f} s"
    )
    for side, (idle, busy, commands) in results.items():
        top = sorted(commands.items(), key=lambda kv: -kv[1])[:5]
        per_s = ", ".join(f"{k} {v / args.window:.1f}/s" for k, v in top)
        print(
            f"{side:>5}: redis CPU {busy * 1000:.1f} ms/s in flight, {idle * 1000:.1f} ms/s idle; "
            f"commands {per_s}"
        )
    (pi, pb, _), (di, db, _) = results["plain"], results["dex"]
    print(
        f"in-flight redis CPU ratio dex/plain {db / pb:.2f} "
        f"(above idle: dex {(db - di) * 1000:.1f} ms/s, plain {(pb - pi) * 1000:.1f} ms/s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default="threads", choices=("threads", "gevent"))
    parser.add_argument("--concurrency", type=int, default=None, help="threads 50, gevent 200")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mix", default="60/25/15", help="reads/idempotent/non-idempotent, %%")
    parser.add_argument("--approve-fraction", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=50, help="calls per request_calls")
    parser.add_argument("--in-flight", type=int, default=0, help="the in-flight mode: N calls")
    parser.add_argument("--hold", type=float, default=300.0, help="in-flight calls' wait, s")
    parser.add_argument("--window", type=float, default=20.0, help="in-flight CPU window, s")
    args = parser.parse_args(argv)
    if args.concurrency is None:
        args.concurrency = 50 if args.pool == "threads" else 200
    if args.in_flight:
        inflight_mode(args)
    else:
        mix_mode(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
