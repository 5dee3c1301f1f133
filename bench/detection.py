"""Detection: a worker machine lost mid-call, time from the kill to the terminal record.

Each trial requests one call of each effect class (`hold_<effect>`, attempt 1 runs until killed,
a retry returns at once), waits until all four are claimed (ledger state `running`), SIGKILLs
the worker's whole process group (main process and pool children, as a lost machine), restarts
the worker (as a supervisor would) and times kill -> terminal record in SQL: the retry's success
for `read` / `idempotent_write`, `outcome_unknown` for the writes. The sweeper runs in this
process (`dex-celery sweep --loop`). Run with the default settings (heartbeat 5 s, sweep 2 s)
and tightened ones.

Beside it, plain Celery (same kill of a task that is running): with early ack the task is never
run again and its result stays `STARTED` for ever; with late ack and a short
`visibility_timeout` the broker redelivers it: the time to the second start is measured.

    .venv/bin/python -m bench.detection --trials 20
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis

from bench.common import BenchWorker, RedisServer, header, percentile, wait_for, workdir
from dex_celery import EffectClass, Settings
from dex_celery.engine.upkeep.sweep import run_forever


@dataclass(frozen=True)
class Config:
    name: str
    heartbeat: float
    sweep: float

    @property
    def target(self) -> float:
        return 2 * self.heartbeat + self.sweep

    def env(self) -> dict[str, str]:
        return {
            "DEX_HEARTBEAT_TIMEOUT": str(self.heartbeat),
            "DEX_SWEEP_INTERVAL": str(self.sweep),
        }


CONFIGS = {
    "default": Config("default", 5.0, 2.0),
    "tight": Config("tight", 1.5, 0.5),
}


def run_dex(
    server: RedisServer, folder: Path, config: Config, trials: int
) -> dict[str, list[float]]:
    from bench.dex_app import build

    prefix = f"det{uuid.uuid4().hex[:6]}"
    db = f"sqlite:///{folder / f'{prefix}.db'}"
    env = {
        "DEX_REDIS_URL": server.url,
        "DEX_DATABASE_URL": db,
        "DEX_KEY_PREFIX": prefix,
        **config.env(),
    }
    settings = Settings.from_env(env)
    _app, dx = build(settings, f"det_client_{config.name}")
    dx.store.create_schema()
    stop = threading.Event()
    sweeper = threading.Thread(target=run_forever, args=(dx,), kwargs={"stop": stop}, daemon=True)
    sweeper.start()
    worker = BenchWorker("bench.dex_app", env, folder, concurrency=4).start()
    times: dict[str, list[float]] = defaultdict(list)
    outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    client = dx.client()
    try:
        for trial in range(trials):
            keys = {
                effect.value: client.request_call(
                    prefix, f"t{trial}", f"c-{effect.value}", f"hold_{effect.value}", {}
                ).key
                for effect in EffectClass
            }

            def all_running(keys: dict[str, str] = keys) -> bool:
                for key in keys.values():
                    entry = dx.ledger.read(key)
                    if entry is None or entry.state != "running":
                        return False
                return True

            wait_for(all_running, timeout=60, what="four attempts claimed")
            time.sleep(random.uniform(0.0, 0.5))
            killed = time.time()
            worker.kill_all()
            worker = BenchWorker("bench.dex_app", env, folder, concurrency=4).start()
            pending = dict(keys)
            deadline = time.monotonic() + 120
            while pending and time.monotonic() < deadline:
                for effect, key in list(pending.items()):
                    record = dx.store.get_call(key)
                    if record is not None and record.finished:
                        times[effect].append(time.time() - killed)
                        outcomes[effect][record.status.value] += 1
                        del pending[effect]
                time.sleep(0.02)
            if pending:
                raise AssertionError(f"no terminal record within 120 s: {pending}")
            print(
                f"  {config.name} trial {trial + 1}: "
                + " ".join(f"{e} {times[e][-1]:.2f}s" for e in keys),
                flush=True,
            )
    finally:
        worker.stop(warm=True)
        stop.set()
        sweeper.join(timeout=10)
    print(
        f"## dex-celery, {config.name} settings (heartbeat {config.heartbeat}s, sweep "
        f"{config.sweep}s; target p95 <= {config.target:.1f}s), {trials} kills"
    )
    for effect, values in times.items():
        print(
            f"{effect:>22}: p50 {percentile(values, 50):5.2f}s  p95 {percentile(values, 95):5.2f}s"
            f"  max {max(values):5.2f}s  outcomes {dict(outcomes[effect])}"
            f"  {'ok' if percentile(values, 95) <= config.target else 'MISSES TARGET'}"
        )
    return times


def run_plain(
    server: RedisServer,
    folder: Path,
    *,
    late: bool,
    trials: int,
    wait: float,
    visibility: float = 5.0,
) -> None:
    env = {
        "BENCH_BROKER_URL": server.url,
        "BENCH_RESULT_BACKEND": server.url,
        "BENCH_ACKS_LATE": "1" if late else "0",
        "BENCH_QUEUE": f"plain{'late' if late else 'early'}",
    }
    if late:
        env["BENCH_VISIBILITY_TIMEOUT"] = f"{visibility:g}"
    os.environ.update(env)
    import importlib

    import bench.plain_app as plain

    plain = importlib.reload(plain)
    client = redis.Redis.from_url(server.url, decode_responses=True)
    args = ("-Q", env["BENCH_QUEUE"])
    worker = BenchWorker("bench.plain_app", env, folder, extra_args=args).start()
    label = (
        f"late ack, visibility_timeout {visibility:g} s" if late else "early ack (Celery's default)"
    )
    redelivery: list[float] = []
    try:
        for trial in range(trials):
            tag = f"{'late' if late else 'early'}-{trial}-{uuid.uuid4().hex[:6]}"
            # Late ack: the task is shorter than the visibility timeout; a longer one would be
            # redelivered again every `visibility_timeout` seconds while it still runs.
            result: Any = plain.hold.delay(tag, 0.6 * visibility if late else 30.0)

            def runs(tag: str = tag) -> list[str]:
                entries = cast(list[str], client.lrange(plain.RUNS_KEY, 0, -1))
                return [r for r in entries if f" {tag} " in r]

            wait_for(lambda: runs(), timeout=60, what="the plain task to start")
            time.sleep(random.uniform(0.0, 0.5))
            killed = time.time()
            worker.kill_all()
            worker = BenchWorker("bench.plain_app", env, folder, extra_args=args).start()
            if late:
                wait_for(
                    lambda: len([r for r in runs() if r.startswith("start")]) >= 2,
                    timeout=wait,
                    what="the broker to redeliver",
                )
                second = [r for r in runs() if r.startswith("start")][1]
                redelivery.append(float(second.split()[-1]) - killed)
                wait_for(
                    lambda: any(r.startswith("end") for r in runs()),
                    timeout=30,
                    what="the redelivered run to end",
                )
                print(f"  plain late trial {trial + 1}: run again {redelivery[-1]:.2f}s after kill")
            else:
                time.sleep(wait)
                starts = [r for r in runs() if r.startswith("start")]
                print(
                    f"  plain early trial {trial + 1}: {wait:.0f}s after the kill the task ran "
                    f"{len(starts)} time(s) and its state is {result.state} "
                    "(never re-run, never marked failed)"
                )
    finally:
        worker.stop(warm=True)
    if late:
        print(
            f"## plain Celery, {label}: kill -> second run p50 "
            f"{percentile(redelivery, 50):.2f}s  max {max(redelivery):.2f}s ({trials} kills; "
            "the running task is run again from the start)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="kills per configuration")
    parser.add_argument("--configs", default="default,tight", help="'' for plain Celery only")
    parser.add_argument("--plain-trials", type=int, default=3)
    parser.add_argument("--plain-wait", type=float, default=30.0)
    parser.add_argument(
        "--plain-visibility",
        type=float,
        default=5.0,
        help="the late-ack run's Kombu visibility_timeout, s (its task runs 0.6 x as long)",
    )
    args = parser.parse_args(argv)
    header("detection: worker lost mid-call, kill -> terminal record")
    folder = workdir("detection")
    server = RedisServer(folder / "redis").start()
    try:
        for name in filter(None, args.configs.split(",")):
            run_dex(server, folder, CONFIGS[name], args.trials)
        if args.plain_trials:
            run_plain(server, folder, late=False, trials=1, wait=args.plain_wait)
            run_plain(
                server,
                folder,
                late=True,
                trials=args.plain_trials,
                wait=120,
                visibility=args.plain_visibility,
            )
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
